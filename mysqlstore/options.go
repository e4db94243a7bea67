package mysqlstore

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
	// maxTableLen leaves room for the suffixes of derived names
	// ("_tokens", "_claim_v1", "_expires_idx") within MySQL's 64-character
	// identifier limit.
	maxTableLen = 40
	// DefaultClaimRetries is how many times Claim, Heartbeat, Complete and
	// Fail are retried after a deadlock or a Galera certification conflict
	// (error 1213) unless WithDeadlockRetries says otherwise.
	DefaultClaimRetries = 8
)

type config struct {
	sqlkit.Config // table, margin, Tx's pool and options, clock offset

	causal  bool
	retries int
	// readFirst: a plain SELECT first, then the new key's CALL for a
	// missing key, the claim procedure for a claimable one.
	readFirst bool
}

func newConfig(opts []Option) (config, error) {
	c := config{
		Config:  sqlkit.NewConfig(DefaultRetentionMargin),
		causal:  true,
		retries: DefaultClaimRetries,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if err := c.Valid("mysqlstore", maxTableLen); err != nil {
		return config{}, err
	}
	return c, nil
}

// WithTable sets the name of the records table, and the prefix of every
// object derived from it: the token table (<table>_tokens), the commit
// marks of Tx (<table>_txmarks), the claim procedures (<table>_claim_v1,
// _v2, _v3, _new) and the expiry index. At most 40 bytes of letters, digits and
// underscores, not starting with a digit. The tables live in the
// connection's current database (the DSN's /dbname); MySQL has no separate
// schema level.
//
// Default: "idem_records".
func WithTable(name string) Option {
	return optionFunc(func(c *config) { c.Table = name })
}

// WithRetentionMargin sets how long past its expires_at a record is kept
// before Sweep deletes it. A record past expires_at is already treated as
// absent by Claim; the margin only keeps it around for inspection and makes
// deletion run well clear of the instant the key becomes new again. Must
// not be negative.
//
// Default: DefaultRetentionMargin (1h).
func WithRetentionMargin(d time.Duration) Option {
	return optionFunc(func(c *config) { c.SetMargin(d) })
}

// WithTxPool sets the pool Tx begins business transactions on. It must reach
// the same database as the store's pool. A separate pool keeps the store's
// own short statements (claims, heartbeats) from queueing behind
// connections held by long handler transactions; see "Pool sizing" in the
// README.
//
// Default: the *sql.DB passed to New.
func WithTxPool(db *sql.DB) Option {
	return optionFunc(func(c *config) { c.SetTxDB(db) })
}

// WithTxOptions sets the options Tx begins business transactions with
// (isolation level, read-only). nil means the server's defaults.
//
// Default: nil (the server's default isolation, REPEATABLE READ unless
// configured otherwise). The fenced update that ends the transaction is a
// locking read, so the fence holds at every isolation level. A read-only
// transaction is ended before the fenced update, which then runs on its
// own: it has no writes to commit with the response.
func WithTxOptions(opts *sql.TxOptions) Option {
	return optionFunc(func(c *config) { c.TxOpts = opts })
}

// WithCausalReads turns causal reads on or off for the claim-or-read and
// Get on Galera clusters. When on and the server reports wsrep_on=ON
// (checked once per Store, at its first claim), those statements run under
// SET STATEMENT wsrep_sync_wait=1 FOR ...: the node first applies every
// transaction the cluster committed before the statement, so a replay on
// one node right after a commit on another sees the completed record
// instead of an in-flight one. It costs one cluster round trip per
// statement on Galera and nothing elsewhere (the statement is sent without
// the prefix).
//
// Default: on.
func WithCausalReads(on bool) Option {
	return optionFunc(func(c *config) { c.causal = on })
}

// WithDeadlockRetries sets how many times a store statement is retried
// after the server reports a deadlock or, on Galera, a certification
// conflict (both error 1213), or a lock wait timeout (1205). A retried
// claim re-reads the record: the loser of a race answers like any
// duplicate. Must not be negative.
//
// Default: DefaultClaimRetries (8).
func WithDeadlockRetries(n int) Option {
	return optionFunc(func(c *config) {
		if n < 0 {
			c.Errs = append(c.Errs, fmt.Errorf("deadlock retries %d is negative", n))
			return
		}
		c.retries = n
	})
}

// WithReadFirst makes Claim always send a plain primary-key SELECT first,
// then the new key's CALL when the key is missing and the claim procedure
// only when it is claimable. By
// default Claim reads first only while most recent claims find their key
// (a retry storm) and tries the new key's insert first otherwise: a replay
// or an in-flight duplicate then costs that insert and the SELECT, a first
// execution one CALL. The option pins reading first: for clients that retry
// aggressively, or wait mode with many waiters.
//
// Default: off (Claim chooses by the recent mix of keys).
func WithReadFirst() Option {
	return optionFunc(func(c *config) { c.readFirst = true })
}

// withClockOffset shifts the database clock the store reads. Tests only.
func withClockOffset(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ClockOffset = d })
}

// names holds the quoted identifiers derived from a config.
type names struct {
	table      string // `idem_records`
	tokens     string // `idem_records_tokens`
	claimProc  string // `idem_records_claim_v3` (migration 0006)
	claimNew   string // `idem_records_claim_new` (migration 0007)
	claimProc2 string // `idem_records_claim_v2` (migration 0003; previous binaries)
	claimProc1 string // `idem_records_claim_v1` (migration 0002; previous binaries)
	expiresIdx string // `idem_records_expires_idx`
	txMarks    string // `idem_records_txmarks` (migration 0005)
	migrations string // `idem_schema_migrations`
}

func quote(name string) string { return "`" + name + "`" }

func (c config) names() names {
	return names{
		table:      quote(c.Table),
		tokens:     quote(c.Table + "_tokens"),
		claimProc:  quote(c.Table + "_claim_v3"),
		claimNew:   quote(c.Table + "_claim_new"),
		claimProc2: quote(c.Table + "_claim_v2"),
		claimProc1: quote(c.Table + "_claim_v1"),
		expiresIdx: quote(c.Table + "_expires_idx"),
		txMarks:    quote(c.Table + "_txmarks"),
		migrations: quote("idem_schema_migrations"),
	}
}
