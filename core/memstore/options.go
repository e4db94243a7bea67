package memstore

import "time"

// DefaultMaxEntries is the number of records a Store holds unless
// WithMaxEntries says otherwise (see WithMaxEntries for what happens when
// it is full). A record costs a few hundred bytes plus its stored
// response.
const DefaultMaxEntries = 100_000

// config is what the options set; New fills in the defaults.
type config struct {
	clock      func() time.Time
	maxEntries int // 0: DefaultMaxEntries; < 0: unbounded
}

// Option configures a Store. Options are applied in order; a nil Option is
// ignored.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithClock sets the clock the store reads "now" from: every lease and
// expiry is computed and compared against it, and it is reported as
// storekit.ClaimResult.Now. Tests use it to drive time without sleeping.
// A nil clock is ignored.
//
// Default: time.Now.
func WithClock(clock func() time.Time) Option {
	return optionFunc(func(c *config) {
		if clock != nil {
			c.clock = clock
		}
	})
}

// WithMaxEntries bounds the number of records the store holds. When the
// store is full, a Claim of a key that has no live record first removes
// expired records and, if the store is still full, fails with an error
// wrapping ErrFull: the engine answers 503 store-unavailable and the
// handler does not run. A record is never evicted before it expires to
// make room, live or completed: losing a key is exactly the failure idem
// exists to prevent (the retry would run the handler again), so refusing
// new work is the safe answer. Keys already held keep working when full:
// a replay, a 409, a takeover of a failed or lapsed record need no room.
// The scan for expired records runs only once one can have expired, so a
// store full of live records rejects new keys cheaply.
//
// A value of zero or less means unbounded: memory then grows with the
// number of distinct keys seen within the retention, which any client
// choosing keys controls; call Purge periodically in that case.
//
// Default: DefaultMaxEntries (100 000).
func WithMaxEntries(n int) Option {
	return optionFunc(func(c *config) {
		if n <= 0 {
			n = -1
		}
		c.maxEntries = n
	})
}
