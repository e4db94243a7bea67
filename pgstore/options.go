package pgstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core/storekit/sqlkit"
	"github.com/idemkit/idem/pgstore/internal/hook"
)

// Option configures New and Migrate. Pass the same options to both: they
// decide which schema and table the store uses and how it is laid out.
// A nil Option is ignored.
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
	defaultSchema = "public"
	defaultTable  = "idem_records"
	// DefaultRetentionMargin is the retention margin used unless
	// WithRetentionMargin says otherwise.
	DefaultRetentionMargin = time.Hour
	// maxTableLen leaves room for the suffixes of derived names
	// ("_payload_p20260101", "_token_seq", ...) within PostgreSQL's
	// 63-byte identifier limit.
	maxTableLen  = 40
	maxSchemaLen = 63
	maxDaysAhead = 90
)

type config struct {
	schema      string
	table       string
	partitioned bool
	daysAhead   int
	margin      time.Duration
	txPool      *pgxpool.Pool
	txIdle      time.Duration
	// functionFirst: every claim calls the claim function, never the bare
	// insert first (tests of the function's own path; withFunctionFirst).
	functionFirst bool
	// batching: concurrent claims, completes and steps share statements
	// (batch.go; on unless WithoutBatching); batchLimit pins their
	// in-flight limit (tests; 0: adaptive).
	batching   bool
	batchLimit int
	listen     listenConfig // listen.go
	// transactional: claims and heartbeats commit without waiting for
	// their WAL flush (WithTransactional).
	transactional bool

	// clockOffset shifts the database clock the store reads (now() +
	// offset). Tests only: it lets them drive a record across a day
	// boundary or past retention without waiting. Zero in production.
	clockOffset time.Duration

	errs []error
}

func newConfig(opts []Option) (config, error) {
	c := config{
		schema:   defaultSchema,
		table:    defaultTable,
		margin:   DefaultRetentionMargin,
		batching: true,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	errs := c.errs
	if err := sqlkit.ValidIdent("schema", c.schema, maxSchemaLen); err != nil {
		errs = append(errs, err)
	}
	if err := sqlkit.ValidIdent("table", c.table, maxTableLen); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return config{}, fmt.Errorf("pgstore: invalid options: %w", err)
	}
	return c, nil
}

// WithSchema sets the PostgreSQL schema holding the store's tables.
// Migrate creates it when missing. The name must be a plain identifier
// (letters, digits, underscore; not starting with a digit); it is quoted,
// so it is case-sensitive.
//
// Default: "public".
func WithSchema(name string) Option {
	return optionFunc(func(c *config) { c.schema = name })
}

// WithTable sets the name of the records table (and the prefix of every
// object derived from it: sequence, indexes, payload table, partitions).
// At most 40 bytes, same character rules as WithSchema.
//
// Default: "idem_records".
func WithTable(name string) Option {
	return optionFunc(func(c *config) { c.table = name })
}

// WithPartitioning selects the partitioned retention mode: records keep
// their ownership state in a small unpartitioned table keyed by (scope, key)
// and store response payloads in a table range-partitioned by day (UTC),
// which Maintain drops whole once every payload in a day is past retention
// plus the margin. daysAhead (1 to 90) is how many days of partitions
// Maintain (and Migrate) create in advance; a missed maintenance run is
// harmless for that many days, and even then rows land in a default
// partition rather than failing. See the package README.
//
// Default: not partitioned; a single plain table pruned by Sweep.
func WithPartitioning(daysAhead int) Option {
	return optionFunc(func(c *config) {
		if daysAhead < 1 || daysAhead > maxDaysAhead {
			c.errs = append(c.errs, fmt.Errorf("partitioning days ahead %d out of range [1, %d]", daysAhead, maxDaysAhead))
			return
		}
		c.partitioned = true
		c.daysAhead = daysAhead
	})
}

// WithRetentionMargin sets how long past its expires_at a record (or a
// day of payloads) is kept before Sweep or Maintain deletes it. A record
// past expires_at is already treated as absent by Claim; the margin only
// keeps it around for inspection and makes deletion run well clear of the
// instant the key becomes new again. Must not be negative.
//
// Default: DefaultRetentionMargin (1h).
func WithRetentionMargin(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.errs = append(c.errs, fmt.Errorf("retention margin %v is negative", d))
			return
		}
		c.margin = d
	})
}

// WithTxPool sets the pool Tx begins business transactions on. It must
// reach the same database as the store's pool. A separate pool keeps the
// store's own short statements (claims, heartbeats) from queueing behind
// connections held by long handler transactions; see "Pool sizing" in the
// README.
//
// Default: the pool passed to New.
func WithTxPool(pool *pgxpool.Pool) Option {
	return optionFunc(func(c *config) {
		if pool == nil {
			c.errs = append(c.errs, errors.New("tx pool is nil"))
			return
		}
		c.txPool = pool
	})
}

// WithoutBatching makes every request send its own statements. By
// default concurrent requests share them, as PostgreSQL shares one WAL
// flush among concurrent commits: while enough statements of a kind are in
// flight, the requests that arrive queue, and the next statement carries
// them all:
//
//   - claims: the claim function called once per row, each row its own
//     claim;
//   - SaveStep, the completes of requests without a Tx and the new
//     keys' inserts (see Store.Claim): one pipeline, one
//     transaction, one synchronous commit, each step fenced, each
//     complete its request's Defer statements followed by its fenced
//     complete (WithTransactional: the inserts, whose commits need not
//     wait for the flush, as one multi-row insert of their own).
//
// Each request gets the answer its own statement would have got, and its
// writes commit with its response or not at all. A shared statement that
// fails is sent again request by request, so one request's error (a
// constraint, a lost lease) is never another's; after a failure that hid a
// commit, a resent complete's fence matches nothing and rolls back its
// deferred statements, so nothing runs twice. Requests that began a Tx
// complete in their own transaction, never batched. A request alone is
// sent at once, and how many statements of a kind go in flight adapts to
// what they take: on an idle database a round trip away nobody queues, on
// a CPU-bound one most requests share (BENCHMARKS.md §3, §4).
//
// Use WithoutBatching when deferred statements rely on transaction-scoped
// state (SET LOCAL, advisory transaction locks, now() as the request's own
// time): batched, the deferred statements of concurrent requests may run
// in one transaction. Where batching shares little (a database a round
// trip away on a saturated host), it measured level with WithoutBatching
// (pgstore/README.md, "Batching").
//
// Default: batching on.
func WithoutBatching() Option {
	return optionFunc(func(c *config) { c.batching = false })
}

func init() { hook.BatchLimit = func(n int) any { return withBatchLimit(n) } }

// withBatchLimit pins the statements of each kind in flight at n instead
// of adapting (tests: n = 1 makes batches form under any load;
// batchtest.WithLimit for other modules' tests).
func withBatchLimit(n int) Option {
	return optionFunc(func(c *config) { c.batchLimit = max(n, 0) })
}

// WithTransactional declares that the store runs in transactional mode:
// handlers keep their effects in the transaction Tx hands out (and call
// anything outside the database with a relayed key, core.RelayKey). Claims
// and heartbeats then commit with synchronous_commit = off: they are
// visible to every session at once but do not wait for their WAL flush.
// The business commit, which is synchronous, flushes them with it (WAL
// order); if the database crashes before it, nothing the claim protected
// was committed either, so a lost claim is a lost lock, never a lost fact.
// A first execution then costs one WAL flush instead of two. Completing
// and anything else that stores a fact stay synchronous — including the
// claim itself once the handler asks for a relay key (core.RelayKey): the
// key names the record, so the record must outlive a crash before the key
// reaches a provider (SyncClaim: one more flush, for those executions only).
// A store whose handlers all relay a key gains nothing from it: SyncClaim
// then costs every first execution one more round trip and row version
// than a synchronous claim, for the same flushes (examples/payments keeps
// synchronous claims for that reason; BENCHMARKS.md §6 measures what
// one more synchronous commit costs).
//
// Do not use it when handlers have effects outside the database without a
// relayed key: a crash and quick recovery of the database during such a
// handler could lose its claim and let a duplicate run it too. See
// "Synchronous and asynchronous commits" in the README.
//
// Default: off (plain mode: every claim and heartbeat waits for its flush).
func WithTransactional() Option {
	return optionFunc(func(c *config) { c.transactional = true })
}

// WithTxIdleTimeout makes every transaction begun by Tx set
// idle_in_transaction_session_timeout (SET LOCAL) to d, so that a
// transaction whose owner never commits or aborts (a leaked handler, a bug
// in calling code) is ended by the server and its connection freed instead
// of pinning locks forever. It must exceed the longest pause a handler
// makes between statements while holding the transaction (for example a
// call to a payment provider). Zero disables it.
//
// Default: 0 (the server's setting applies).
func WithTxIdleTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.errs = append(c.errs, fmt.Errorf("tx idle timeout %v is negative", d))
			return
		}
		c.txIdle = d
	})
}

// withFunctionFirst makes every claim call the claim function first, as if
// each found its key existing (tests of the function's own paths).
func withFunctionFirst() Option {
	return optionFunc(func(c *config) { c.functionFirst = true })
}

// withClockOffset shifts the database clock the store reads. Tests only.
func withClockOffset(d time.Duration) Option {
	return optionFunc(func(c *config) { c.clockOffset = d })
}

// names holds the quoted identifiers derived from a config.
type names struct {
	schema     string // quoted schema
	table      string // quoted schema.table (claim/records table)
	payload    string // quoted schema.table_payload (partitioned mode)
	payloadDef string // quoted default partition
	seq        string // quoted schema.table_token_seq
	migrations string // quoted schema.idem_schema_migrations
	expiresIdx string // quoted bare index name
	payloadIdx string
	claimFn    string // quoted schema.table_claim (migration 0002; older binaries)
	claimRowFn string // quoted schema.table_claim_row (migration 0004)
	claimRow   string // quoted schema.table_claim_row_t, its result type
}

func (c config) names() names {
	q := func(parts ...string) string { return pgx.Identifier(parts).Sanitize() }
	return names{
		schema:     q(c.schema),
		table:      q(c.schema, c.table),
		payload:    q(c.schema, c.table+"_payload"),
		payloadDef: q(c.schema, c.table+"_payload_default"),
		seq:        q(c.schema, c.table+"_token_seq"),
		migrations: q(c.schema, "idem_schema_migrations"),
		expiresIdx: q(c.table + "_expires_idx"),
		payloadIdx: q(c.table + "_payload_expires_idx"),
		claimFn:    q(c.schema, c.table+"_claim"),
		claimRowFn: q(c.schema, c.table+"_claim_row"),
		claimRow:   q(c.schema, c.table+"_claim_row_t"),
	}
}

// partitionName returns the bare name of the payload partition for the UTC
// day containing t.
func (c config) partitionName(t time.Time) string {
	return c.table + "_p" + t.UTC().Format("20060102")
}

func (c config) mode() string {
	if c.partitioned {
		return "partitioned"
	}
	return "plain"
}
