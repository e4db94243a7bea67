package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

var (
	// ErrNoLease is returned by Tx, SQLTx and Defer when ctx does not belong to a handler
	// that idem let proceed (no storekit.Lease in the context).
	ErrNoLease = errors.New("pgstore: no idem lease in context: Tx and Defer must be called with the context of a handler idem let proceed")
	// ErrLeaseFinished is returned by Tx, SQLTx and Defer when the lease was already
	// completed or failed: its transaction, if any, is over. The
	// transaction's methods return it too (wrapping pgx.ErrTxClosed) when
	// a handler goroutine uses the transaction after that.
	ErrLeaseFinished = errors.New("pgstore: the lease is finished; its transaction was committed or rolled back")
	// ErrTxOwned is returned by Commit and Rollback on the transaction Tx
	// (or SQLTx) hands out: idem ends it (commit with the stored response,
	// or rollback on failure), not the handler. Calling them has no effect
	// on the transaction, so the usual `defer tx.Rollback(ctx)` is harmless.
	ErrTxOwned = errors.New("pgstore: the lease transaction is committed or rolled back by idem, not by the handler")
)

// errTxEnded is what the lease's transaction answers once the lease is over.
var errTxEnded = fmt.Errorf("%w: %w", ErrLeaseFinished, pgx.ErrTxClosed)

// txKey is the lease attachment under which the transaction state lives.
type txKey struct{}

// txState is attached to a lease once (by Tx or by Complete/Fail) and never
// removed: after Complete or Fail it stays as a tombstone (done, no tx), so a
// late Tx call from a leaked handler goroutine gets ErrLeaseFinished instead
// of opening a transaction nobody will ever end.
type txState struct {
	mu       sync.Mutex
	tx       *leaseTx
	deferred []deferredStmt // Defer's, in order
	done     bool
}

// rollbackTimeout bounds the rollback of an abandoned transaction; it runs
// on a context detached from the caller's so a cancelled request cannot
// leave the connection inside a transaction.
const rollbackTimeout = 5 * time.Second

// Tx returns the business transaction of the current idem execution:
// calling Tx twice with contexts carrying the same lease returns the same
// transaction. ctx must be (or derive from) the context of a handler idem
// let proceed; otherwise Tx returns ErrNoLease. The engine's store must be
// a *Store, or a decorator exposing it through an Unwrap() core.Store
// method.
//
// Tx itself costs nothing: the transaction takes its connection from the
// pool at its first statement, and BEGIN travels in the same round trip as
// that statement (pipelined). Exec, Query, QueryRow and SendBatch begin it
// that way; CopyFrom, Begin (a savepoint), LargeObjects and Conn need a
// transaction already open and spend one round trip on BEGIN first when
// they are the first call.
//
// The handler does its writes in the transaction and neither commits nor
// rolls it back (Commit and Rollback return ErrTxOwned and do nothing;
// nested transactions via tx.Begin are savepoints and behave normally).
// A handler that ends it with SQL anyway (tx.Exec(ctx, "ROLLBACK") or
// "COMMIT") gets its later statements refused, since they would run
// outside it; after a ROLLBACK, Complete records nothing, releases the key
// and wraps storekit.ErrNotCommitted (the engine answers 500); after a
// COMMIT the writes have landed, so Complete records the response on its
// own and Fail completes the record as not retained, so a retry does not
// run them again; so does a Complete that cannot record the response. A
// COMMIT AND CHAIN counts as a COMMIT. However the handler ended it (a tag
// idem did not read: Query, SendBatch, a multi-statement Exec, Conn(); or
// a COMMIT whose answer was lost with the connection), idem asks
// PostgreSQL how the transaction ended, by the id BEGIN's round trip took
// (txid_status): committed counts as a COMMIT, rolled back as a ROLLBACK,
// and an answer it cannot get completes the record as not retained, so
// the key is never released over writes that may have landed.
// When the engine commits the response, Store.Complete sends its fenced
// update and COMMIT together, in one round trip: the business writes and
// the stored response are one atomic fact. If the lease was lost meanwhile
// (another instance took the key over), the fenced update raises an error,
// PostgreSQL skips the COMMIT, the transaction is rolled back, the
// handler's writes vanish, and Complete returns core.ErrLeaseLost. On abort
// (handler error, panic, 5xx), Store.Fail rolls the transaction back. A
// transaction that never ran a statement costs nothing at either end.
//
// The transaction holds a pool connection from its first statement until
// then; see "Pool sizing" in the README (and WithTxPool). As with any
// pgx.Tx, it is not for concurrent use, and not for use after the handler
// has returned.
func Tx(ctx context.Context) (pgx.Tx, error) {
	return withLeaseTx(ctx, "tx", func(t *leaseTx) (pgx.Tx, error) { return t, nil })
}

// withLeaseTx runs f on the transaction of the lease in ctx (created on
// first use), under the lease state's lock: Tx and SQLTx are its two faces.
func withLeaseTx[T any](ctx context.Context, op string, f func(*leaseTx) (T, error)) (T, error) {
	var zero T
	lease, ok := storekit.LeaseFromContext(ctx)
	if !ok {
		return zero, ErrNoLease
	}
	s := storeOf(lease)
	if s == nil {
		return zero, fmt.Errorf("pgstore: %s: the lease was granted by %T, not by a *pgstore.Store (or a store whose Unwrap returns one)", op, lease.Store())
	}
	st := attachState(lease)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return zero, ErrLeaseFinished
	}
	if st.tx == nil {
		st.tx = &leaseTx{s: s}
	}
	return f(st.tx)
}

// storeOf returns the *Store that granted lease, looking through store
// decorators (metrics, tracing), or nil.
func storeOf(lease storekit.Lease) *Store {
	s, _ := storekit.As[*Store](lease.Store())
	return s
}

func attachState(lease storekit.Lease) *txState {
	v, _ := lease.Attach(txKey{}, func() (any, error) { return &txState{}, nil })
	return v.(*txState)
}

func (s *Store) txIdleMillis() int64 {
	return max(s.cfg.txIdle.Milliseconds(), 1)
}

// takeTx finishes the lease's transaction state for fence f and returns its
// transaction if one holds a connection, and the statements queued by Defer.
// It returns nil, nil when ctx carries no lease of this store for f. Either
// way, from now on Tx and Defer refuse, and the handed-out transaction
// refuses every call.
func (s *Store) takeTx(ctx context.Context, f storekit.Fence) (*leaseTx, []deferredStmt) {
	lease, ok := storekit.LeaseFromContext(ctx)
	if !ok || lease.Fence() != f {
		return nil, nil
	}
	if storeOf(lease) != s {
		return nil, nil
	}
	st := attachState(lease)
	st.mu.Lock()
	t, deferred := st.tx, st.deferred
	st.done = true
	st.tx, st.deferred = nil, nil
	st.mu.Unlock()
	if t == nil || !t.end() {
		return nil, deferred
	}
	return t, deferred
}

// abandonTx rolls back the lease's transaction for f, if any, and drops the
// deferred statements.
func (s *Store) abandonTx(ctx context.Context, f storekit.Fence) {
	if t, _ := s.takeTx(ctx, f); t != nil {
		t.rollback(ctx)
	}
}

// errTxNotBegun: the handler's transaction never began (its first
// statement failed before reaching the server); its writes did not land.
var errTxNotBegun = fmt.Errorf("the handler's transaction never began, its writes did not land: %w", storekit.ErrNotCommitted)

// completeInTx sends the fenced complete and COMMIT in one round trip on the
// handler's transaction. The statement raises when the fence matches
// nothing (completeTx), so PostgreSQL skips the COMMIT; the store then
// rolls back.
//
// When it fails for a reason other than a lost lease, it also marks the
// record failed (fenced, best effort), so a retry may run the handler again
// at once instead of waiting for the lease to lapse. That is safe only
// because the handler's writes were in the transaction: they were rolled
// back with it. (If the connection died during COMMIT and the commit did
// land, the record is completed and the fenced fail matches nothing.)
func (s *Store) completeInTx(ctx context.Context, t *leaseTx, f storekit.Fence, deferred []deferredStmt, args []any) error {
	// The handler committed writes itself (COMMIT sent as SQL): they
	// have landed, so whatever fails now, the key is not released.
	committed := t.committed.Load()
	if !t.began && !t.connLost() {
		// The handler's first statement never reached the server (its
		// ctx ended first) and it answered anyway: its writes did not
		// land. A complete sent now would run outside any transaction.
		t.rollback(ctx)
		return s.completeFailed(ctx, f, errTxNotBegun, len(deferred) > 0)
	}
	if t.endedBySQL() {
		t.release()
		outcome := s.endedOutcome(ctx, t)
		if outcome == txCommitted {
			// Record the response (and run the deferred statements) on
			// their own.
			waiters, err := s.sendDeferred(ctx, deferred, args)
			if err != nil {
				return s.completeNotRetained(ctx, f, err)
			}
			if waiters {
				s.notify(ctx, f.Scope, f.Key)
			}
			return nil
		}
		if outcome == txUnknown {
			// Whether the writes landed cannot be known: the key is
			// not released, lest a retry run them twice.
			return s.completeNotRetained(ctx, f, errTxOutcomeUnknown)
		}
		// Rolled back: the writes did not land, so the response must
		// not be recorded.
		s.releaseAfterTxFailure(ctx, f)
		return fmt.Errorf("pgstore: complete: the handler ended the lease transaction with SQL and it was rolled back, its writes did not land: %w", storekit.ErrNotCommitted)
	}
	b := &pgx.Batch{}
	queueDeferred(b, deferred)
	b.Queue(s.sql.completeTx, args...)
	b.Queue("commit")
	br := t.tx.SendBatch(ctx, b)
	err := readDeferred(br, len(deferred))
	var waiters bool
	if err == nil {
		err = br.QueryRow().Scan(&waiters)
	}
	tag, cerr := br.Exec()
	if berr := br.Close(); err == nil {
		err = cerr
		if err == nil {
			err = berr
		}
	}
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		t.rollback(ctx)
		// After a COMMIT AND CHAIN what came before it landed; one whose
		// tag idem did not read shows as the first transaction committed.
		// (So does this complete's own COMMIT whose answer was lost: the
		// fenced not-retained complete then matches nothing.)
		if committed || !isLeaseLost(err) && s.endedOutcome(ctx, t) == txCommitted {
			return s.completeNotRetained(ctx, f, err)
		}
		return s.completeFailed(ctx, f, err, len(deferred) > 0)
	}
	t.release()
	if waiters { // after the commit: waiters must find the record completed
		s.notify(ctx, f.Scope, f.Key)
	}
	return nil
}

// failInTx rolls the handler's transaction back and runs the fenced fail on
// the same connection, both in one round trip.
func (s *Store) failInTx(ctx context.Context, t *leaseTx, f storekit.Fence) (matched, waiters bool, err error) {
	if t.committed.Load() ||
		t.endedBySQL() && s.endedOutcome(ctx, t) != txRolledBack ||
		t.connLost() && s.endedOutcome(ctx, t) == txCommitted {
		// The handler committed its writes itself (or ended the
		// transaction, and PostgreSQL cannot say it rolled back; or its
		// COMMIT landed before the connection died) and then failed: a
		// retry must not run them again. The record is completed as not
		// retained (retries get the not-retained answer), as mysqlstore
		// and sqlitestore do after a handler's own commit. What followed
		// a COMMIT AND CHAIN is rolled back.
		t.rollback(ctx)
		return fenced(ctx, s.pool, s.sql.complete, notRetainedArgs(f)...)
	}
	b := &pgx.Batch{}
	b.Queue("rollback")
	b.Queue(s.sql.fail, f.Scope, f.Key, f.Token)
	br := t.conn.SendBatch(ctx, b)
	_, rerr := br.Exec()
	err = br.QueryRow().Scan(&waiters)
	if berr := br.Close(); rerr == nil && err == nil {
		err = berr
	}
	t.release() // a connection still in a transaction is destroyed, which rolls it back
	if rerr != nil {
		// The rollback did not go through (connection lost): the fail
		// did not either. Try it on the pool.
		return fenced(ctx, s.pool, s.sql.fail, f.Scope, f.Key, f.Token)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	return err == nil, waiters, err
}

// txOutcome is how a lease transaction the handler ended with SQL ended.
type txOutcome int

const (
	txUnknown txOutcome = iota
	txCommitted
	txRolledBack
)

// errTxOutcomeUnknown: the handler ended the lease transaction and
// PostgreSQL could not say how.
var errTxOutcomeUnknown = errors.New("pgstore: the handler ended the lease transaction with SQL and whether it committed is unknown")

// endedOutcome asks PostgreSQL how the transaction t, which the handler
// ended with SQL, ended: a COMMIT idem saw the tag of is known; any other
// end (a tag idem did not read: Query, SendBatch, a multi-statement Exec,
// the connection from Conn) is asked by the transaction's id, taken at
// BEGIN. Unknown when the database cannot answer.
func (s *Store) endedOutcome(ctx context.Context, t *leaseTx) txOutcome {
	if t.committed.Load() {
		return txCommitted
	}
	if t.xid == 0 {
		return txUnknown
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	var (
		status *string
		err    error
	)
	// A few tries: the connection that asks may die as the handler's did;
	// the pool hands out another.
	for range 3 {
		if err = s.pool.QueryRow(qctx, `SELECT txid_status($1)`, t.xid).Scan(&status); err == nil || qctx.Err() != nil {
			break
		}
	}
	if err != nil || status == nil {
		return txUnknown
	}
	switch *status {
	case "committed":
		return txCommitted
	case "aborted":
		return txRolledBack
	}
	return txUnknown // in progress: not ended after all (another session?)
}

// isLeaseLost reports whether err is completeTx's lease-lost error.
func isLeaseLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, leaseLostMarker)
}

func (s *Store) releaseAfterTxFailure(ctx context.Context, f storekit.Fence) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if matched, waiters, err := fenced(fctx, s.pool, s.sql.fail, f.Scope, f.Key, f.Token); err == nil && matched && waiters {
		s.notify(fctx, f.Scope, f.Key)
	}
}

// notRetainedArgs complete f as not retained (500): the handler's own
// COMMIT landed its writes, but there is no response to replay.
func notRetainedArgs(f storekit.Fence) []any {
	return completeArgs(f, storekit.StoredResponse{Status: 500, NotRetained: true})
}

// completeNotRetained handles a complete that failed (cause) after the
// handler committed writes itself: they landed, so the key must not be
// released (a retry would run them again). The record is completed as not
// retained instead, fenced (it matches nothing if the complete did land
// and only its answer was lost), and the error returned.
func (s *Store) completeNotRetained(ctx context.Context, f storekit.Fence, cause error) error {
	if isLeaseLost(cause) {
		return fmt.Errorf("pgstore: complete: %w (handler transaction rolled back)", core.ErrLeaseLost)
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if matched, waiters, err := fenced(fctx, s.pool, s.sql.complete, notRetainedArgs(f)...); err == nil && matched && waiters {
		s.notify(fctx, f.Scope, f.Key)
	}
	return wrap(ctx, "complete (the handler committed its writes itself; the response could not be recorded, the record is completed as not retained)", cause)
}
