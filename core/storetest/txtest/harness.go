package txtest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemkit/idem/core/storekit"
)

// Tx is the handler's view of the lease transaction a store hands out
// (pgstore.Tx's pgx.Tx; mysqlstore.Tx's and sqlitestore.Tx's *sql.Tx, see
// SQLTx). Two calls of Harness.Tx with one lease must return equal (==)
// values.
type Tx interface {
	// Exec runs one statement in the transaction.
	Exec(ctx context.Context, query string, args ...any) error
	// Commit and Rollback are the handler ending the transaction through
	// the object, not with SQL.
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// SQLTx is the Tx of a database/sql transaction.
func SQLTx(tx *sql.Tx) Tx { return sqlTx{tx} }

type sqlTx struct{ tx *sql.Tx }

func (s sqlTx) Exec(ctx context.Context, query string, args ...any) error {
	_, err := s.tx.ExecContext(ctx, query, args...)
	return err
}
func (s sqlTx) Commit(context.Context) error   { return s.tx.Commit() }
func (s sqlTx) Rollback(context.Context) error { return s.tx.Rollback() }

// Env is one fresh store and its database, as a case sees them. Queries
// the kit passes (Ints, Tx.Exec, Defer) use ? placeholders, rewritten to
// $1, $2 … when Harness.Dollar is set.
type Env struct {
	// Store is migrated, on a schema or database of its own.
	Store storekit.Store
	// Ledger names the business table the handler writes, empty: columns k
	// (text) and owner (integer), both NOT NULL, and no unique key, so that
	// a double execution shows as two rows instead of a constraint error.
	Ledger string
	// Ints runs a query outside any lease and returns its one integer
	// column.
	Ints func(ctx context.Context, query string, args ...any) ([]int64, error)
	// InUse is the number of connections the store's pools hold now.
	InUse func() int
	// Lapse makes the lease of the record (scope, key) lapse now, by the
	// database's clock (locked_until in the past), so that a claim may take
	// it over; nothing else about the record changes.
	Lapse func(t *testing.T, scope, key string)
	// Refuse makes the database refuse every insert and update of the
	// store's records, with an error whose message holds the row's key,
	// until undo is called.
	Refuse func(t *testing.T, key string) (undo func())
	// Marks counts the store's commit marks (see Harness.CommitMarks); nil
	// for a store without them.
	Marks func(t *testing.T) int
}

// Harness is what a transactional store gives the kit. The fields after
// ErrLeaseFinished state where stores genuinely differ; the kit holds each
// store to the behaviour its harness states.
type Harness struct {
	// New opens a fresh Env. It fails t (never skips) when the database is
	// unreachable, and releases everything when t ends.
	New func(t *testing.T) *Env
	// Tx and Defer are the store's package functions (pgstore.Tx, Defer…).
	Tx    func(ctx context.Context) (Tx, error)
	Defer func(ctx context.Context, query string, args ...any) error
	// ErrNoLease and ErrLeaseFinished are the store's errors for Tx and
	// Defer without a lease and after it ended.
	ErrNoLease, ErrLeaseFinished error
	// Dollar: the database's placeholders are $1, $2 … (PostgreSQL).
	Dollar bool
	// Parallel runs the cases in parallel (t.Parallel).
	Parallel bool

	// TxOwned is what Commit and Rollback on the handed-out transaction
	// return when the store refuses them (pgstore.ErrTxOwned; a *sql.Tx
	// answers sql.ErrTxDone to the second call): they then do nothing. nil: they end the transaction, and the store learns from its
	// commit mark whether the handler's writes landed (CommitMarks).
	TxOwned error
	// CommitMarks: the lease transaction's first write is a commit mark
	// (mysqlstore, sqlitestore), committed exactly with the handler's
	// writes, so that a takeover after the handler committed itself and
	// died completes the record as not retained instead of running it
	// again. Env.Marks counts them. A store without them (pgstore) cannot
	// tell after a crash that a handler ended its transaction with COMMIT.
	CommitMarks bool
	// SQLCommits and SQLRollbacks are statements a handler may send on the
	// transaction to end it with SQL (default: COMMIT, ROLLBACK). After a
	// COMMIT AND CHAIN the handler's statements run in the chained
	// transaction: RefusesAfterSQLEnd does not apply to it.
	SQLCommits, SQLRollbacks []string
	// SQLRollbackErr is what Complete returns (errors.Is) after the handler
	// rolled the transaction back with SQL (default
	// storekit.ErrNotCommitted: the key is released). A store whose later
	// statements on that transaction autocommit unseen answers another
	// error (mysqlstore.ErrTxRolledByServer) and completes the record as
	// not retained, so that a retry cannot run them again; Fail then does
	// the same.
	SQLRollbackErr error
	// RefusesAfterSQLEnd: a statement the handler sends on the transaction
	// after ending it with SQL fails instead of running outside it
	// (pgstore). Otherwise it may autocommit, and the kit checks only that
	// a key whose writes landed is never released.
	RefusesAfterSQLEnd bool
	// SQLCommitUnseen states a known gap (mysqlstore): the store does not
	// see a COMMIT sent as SQL, and runs its own statements at Complete in
	// autocommit, one by one: after a refused deferred statement the
	// response is recorded all the same, yet Complete answers
	// storekit.ErrNotCommitted. The key is never released.
	SQLCommitUnseen bool
	// ReleasesAfterSQLRollbackWrites states a known gap (sqlitestore): after
	// a ROLLBACK sent as SQL the store releases the key, though statements
	// the handler ran on the transaction afterwards autocommitted unseen,
	// and a retry runs them again. The kit checks that the store does
	// exactly that, so that closing the gap shows as this field going.
	ReleasesAfterSQLRollbackWrites bool
	// DeferredBeforeFence: the deferred statements run ahead of the fenced
	// complete, in one round trip (pgstore), so that a stale owner's
	// refused deferred statement makes its Complete answer
	// storekit.ErrNotCommitted rather than storekit.ErrLeaseLost. Either
	// way nothing of the stale owner's commits.
	DeferredBeforeFence bool
	// TakeoverWaitsForTx: a takeover waits for the lapsed owner's open
	// transaction to end, so a stale owner's transaction begins after the
	// takeover, not before. SQLite: the lease transaction holds the
	// database's only write lock from its first statement. mysqlstore: the
	// takeover reads the commit mark with a locking read, since a handler
	// that commits the transaction itself would otherwise commit its writes
	// after a takeover that saw no mark.
	TakeoverWaitsForTx bool

	// Counted, when set, opens an Env on one connection whose statements
	// Counter counts, for the statement counts per phase (Counts).
	Counted func(t *testing.T) (*Env, Counter)
	// Counts is the number of statements (or round trips: whatever Counter
	// counts) each phase of the query-count script costs; see Phases.
	Counts map[string]int
}

// Counter counts what a store sends to its database.
type Counter interface {
	Reset()
	// Count returns the number counted since Reset and a description of
	// it for failure messages.
	Count() (n int, detail string)
}

// SQLInts is Env.Ints on a database/sql pool.
func SQLInts(db *sql.DB) func(ctx context.Context, query string, args ...any) ([]int64, error) {
	return func(ctx context.Context, query string, args ...any) ([]int64, error) {
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []int64
		for rows.Next() {
			var v int64
			if err := rows.Scan(&v); err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, rows.Err()
	}
}
