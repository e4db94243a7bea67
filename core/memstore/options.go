package memstore

import "time"

// config is what the options set; New fills in the defaults.
type config struct {
	clock      func() time.Time
	maxEntries int
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
// core.ClaimResult.Now. Tests use it to drive time without sleeping.
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
// wrapping ErrFull. A live record is never evicted to make room: losing a
// key is exactly the failure idem exists to prevent, so refusing new work
// is the safe answer. The scan for expired records runs only once one can
// have expired, so a store full of live records rejects new keys cheaply.
// A value of zero or less means unbounded.
//
// Default: 0 (unbounded).
func WithMaxEntries(n int) Option {
	return optionFunc(func(c *config) {
		if n < 0 {
			n = 0
		}
		c.maxEntries = n
	})
}
