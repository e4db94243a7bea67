package sqlitestore

import (
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// Option configures New and Migrate. Pass the same options to both: they
// decide which tables the store uses. A nil Option is ignored.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) {
	if f != nil {
		f(c)
	}
}

const (
	// DefaultRetentionMargin is the retention margin used unless
	// WithRetentionMargin says otherwise.
	DefaultRetentionMargin = time.Hour
	// DefaultPollInterval is how often a Watch checks for commits made by
	// other processes unless WithPollInterval says otherwise.
	DefaultPollInterval = 50 * time.Millisecond
	// maxTableLen leaves room for the suffixes of derived names.
	maxTableLen = 48
)

type config struct {
	sqlkit.Config // table, margin, Tx's pool and options, clock offset

	poll      time.Duration
	ungrouped bool // withoutGroupCommit
}

func newConfig(opts []Option) (config, error) {
	c := config{Config: sqlkit.NewConfig(DefaultRetentionMargin), poll: DefaultPollInterval}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if err := c.Valid("sqlitestore", maxTableLen); err != nil {
		return config{}, err
	}
	return c, nil
}

// WithTable sets the name of the records table, and the prefix of every
// object derived from it: <table>_tokens, <table>_steps, <table>_txmarks,
// the expiry index and the triggers. At most 48 bytes of letters, digits
// and underscores, not starting with a digit.
//
// Default: "idem_records".
func WithTable(name string) Option {
	return optionFunc(func(c *config) { c.Table = name })
}

// WithRetentionMargin sets how long past its expires_at a record is kept
// before Sweep deletes it. Claim already treats such a record as absent;
// the margin keeps it for inspection. Must not be negative.
//
// Default: DefaultRetentionMargin (1h).
func WithRetentionMargin(d time.Duration) Option {
	return optionFunc(func(c *config) { c.SetMargin(d) })
}

// WithTxPool sets the pool Tx begins business transactions on. It must open
// the same database file as the store's pool.
//
// Default: the *sql.DB passed to New.
func WithTxPool(db *sql.DB) Option {
	return optionFunc(func(c *config) { c.SetTxDB(db) })
}

// WithTxOptions sets the options Tx begins business transactions with. A
// read-only transaction writes no commit mark and takes no write lock.
//
// Default: nil (a read-write transaction).
func WithTxOptions(opts *sql.TxOptions) Option {
	return optionFunc(func(c *config) { c.TxOpts = opts })
}

// WithPollInterval sets how often a Watch (wait mode) checks whether
// another process committed to the database (PRAGMA data_version on one
// connection, held only while someone watches). Changes made through this
// Store wake watchers at once, whatever the interval. Must be positive.
//
// Default: DefaultPollInterval (50ms).
func WithPollInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.Errs = append(c.Errs, fmt.Errorf("poll interval %v must be positive", d))
			return
		}
		c.poll = d
	})
}

// withClockOffset shifts the database clock the store reads. Tests only.
func withClockOffset(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ClockOffset = d })
}

// names holds the quoted identifiers derived from a config.
type names struct {
	table, tokens, steps, txMarks, expiresIdx, migrations string
	trgComplete, trgDelete                                string
}

func quote(name string) string { return `"` + name + `"` }

func (c config) names() names {
	return names{
		table:       quote(c.Table),
		tokens:      quote(c.Table + "_tokens"),
		steps:       quote(c.Table + "_steps"),
		txMarks:     quote(c.Table + "_txmarks"),
		expiresIdx:  quote(c.Table + "_expires_idx"),
		trgComplete: quote(c.Table + "_steps_on_complete"),
		trgDelete:   quote(c.Table + "_steps_on_delete"),
		migrations:  quote("idem_schema_migrations"),
	}
}

// withoutGroupCommit gives every write a transaction (and an fsync) of its
// own instead of sharing one with the writes queued beside it (writer.go):
// the comparison of BenchmarkGroupCommit.
func withoutGroupCommit() Option {
	return optionFunc(func(c *config) { c.ungrouped = true })
}
