package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
)

var (
	// ErrNoLease is returned by Tx when ctx does not belong to a handler
	// that idem let proceed (no core.Lease in the context).
	ErrNoLease = errors.New("pgstore: no idem lease in context: Tx must be called with the context of a handler idem let proceed")
	// ErrLeaseFinished is returned by Tx when the lease was already
	// completed or failed: its transaction, if any, is over.
	ErrLeaseFinished = errors.New("pgstore: the lease is finished; its transaction was committed or rolled back")
	// ErrTxOwned is returned by Commit and Rollback on the transaction Tx
	// hands out: idem ends it (commit with the stored response, or rollback
	// on failure), not the handler. Calling them has no effect, so the
	// usual `defer tx.Rollback(ctx)` is harmless.
	ErrTxOwned = errors.New("pgstore: the lease transaction is committed or rolled back by idem, not by the handler")
)

// txKey is the lease attachment under which the transaction state lives.
type txKey struct{}

// txState is attached to a lease once (by Tx or by Complete/Fail) and never
// removed: after Complete or Fail it stays as a tombstone (done, no tx), so a
// late Tx call from a leaked handler goroutine gets ErrLeaseFinished instead
// of opening a transaction nobody will ever end.
type txState struct {
	mu   sync.Mutex
	tx   pgx.Tx
	done bool
}

// rollbackTimeout bounds the rollback of an abandoned transaction; it runs
// on a context detached from the caller's so a cancelled request cannot
// leave the connection inside a transaction.
const rollbackTimeout = 5 * time.Second

// Tx returns the business transaction of the current idem execution,
// beginning it on first use: calling Tx twice with contexts carrying the same
// lease returns the same transaction. ctx must be (or derive from) the
// context of a handler idem let proceed; otherwise Tx returns ErrNoLease.
// The engine's store must be a *Store, or a decorator exposing it through
// an Unwrap() core.Store method.
//
// The handler does its writes in the transaction and neither commits nor
// rolls it back (Commit and Rollback return ErrTxOwned and do nothing;
// nested transactions via tx.Begin are savepoints and behave normally).
// When the engine commits the response, Store.Complete runs its fenced
// update inside this transaction and commits it: the business writes and
// the stored response are one atomic fact. If the lease was lost meanwhile
// (another instance took the key over), the fenced update matches nothing,
// the transaction is rolled back, the handler's writes vanish, and Complete
// returns core.ErrLeaseLost. On abort (handler error, panic, 5xx),
// Store.Fail rolls the transaction back.
//
// The transaction holds a pool connection until then; see "Pool sizing" in
// the README (and WithTxPool).
func Tx(ctx context.Context) (pgx.Tx, error) {
	lease, ok := core.LeaseFromContext(ctx)
	if !ok {
		return nil, ErrNoLease
	}
	s := storeOf(lease)
	if s == nil {
		return nil, fmt.Errorf("pgstore: tx: the lease was granted by %T, not by a *pgstore.Store (or a store whose Unwrap returns one)", lease.Store())
	}
	st := attachState(lease)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return nil, ErrLeaseFinished
	}
	if st.tx == nil {
		tx, err := s.txPool.BeginTx(ctx, s.txOptions())
		if err != nil {
			return nil, wrap(ctx, "tx: begin", err)
		}
		st.tx = tx
	}
	return handlerTx{st.tx}, nil
}

// storeOf returns the *Store that granted lease, looking through store
// decorators (metrics, tracing) that expose the store they wrap with
// Unwrap() core.Store, or nil.
func storeOf(lease *core.Lease) *Store {
	st := lease.Store()
	for range 8 { // bounded: a decorator cycle must not hang
		switch v := st.(type) {
		case *Store:
			return v
		case interface{ Unwrap() core.Store }:
			st = v.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

func attachState(lease *core.Lease) *txState {
	v, _ := lease.Attach(txKey{}, func() (any, error) { return &txState{}, nil })
	return v.(*txState)
}

func (s *Store) txOptions() pgx.TxOptions {
	if s.cfg.txIdle <= 0 {
		return pgx.TxOptions{}
	}
	// BeginQuery runs over the simple protocol (no arguments), so both
	// statements go in one round trip.
	ms := s.cfg.txIdle.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return pgx.TxOptions{BeginQuery: fmt.Sprintf("BEGIN; SET LOCAL idle_in_transaction_session_timeout = %d", ms)}
}

// handlerTx is the transaction as the handler sees it: everything passes
// through except ending it.
type handlerTx struct {
	pgx.Tx
}

func (handlerTx) Commit(context.Context) error   { return ErrTxOwned }
func (handlerTx) Rollback(context.Context) error { return ErrTxOwned }

// takeTx finishes the lease's transaction state for fence f and returns the
// open transaction, if one was begun. It returns nil when ctx carries no
// lease of this store for f. Either way, from now on Tx refuses to begin one.
func (s *Store) takeTx(ctx context.Context, f core.Fence) pgx.Tx {
	lease, ok := core.LeaseFromContext(ctx)
	if !ok || lease.Fence() != f {
		return nil
	}
	if storeOf(lease) != s {
		return nil
	}
	st := attachState(lease)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.done = true
	tx := st.tx
	st.tx = nil
	return tx
}

// abandonTx rolls back the lease's transaction for f, if any.
func (s *Store) abandonTx(ctx context.Context, f core.Fence) {
	if tx := s.takeTx(ctx, f); tx != nil {
		rollback(ctx, tx)
	}
}

func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	// A failed rollback closes the connection (pgx), which ends the
	// transaction server-side just the same.
	_ = tx.Rollback(rctx)
}

// completeInTx runs the fenced complete inside the handler's transaction and
// commits it; on any failure the transaction is rolled back.
//
// When it fails for a reason other than a lost lease, it also marks the
// record failed (fenced, best effort), so a retry may run the handler again
// at once instead of waiting for the lease to lapse. That is safe only
// because the handler's writes were in the transaction: they were rolled
// back with it. (If the connection died during COMMIT and the commit did
// land, the record is completed and the fenced fail matches nothing.)
func (s *Store) completeInTx(ctx context.Context, tx pgx.Tx, f core.Fence, args []any) error {
	matched, waiters, err := fenced(ctx, tx, s.sql.complete, args...)
	if err != nil {
		rollback(ctx, tx)
		s.releaseAfterTxFailure(ctx, f)
		return wrap(ctx, "complete (in transaction)", err)
	}
	if !matched {
		rollback(ctx, tx)
		return fmt.Errorf("pgstore: complete: %w (handler transaction rolled back)", core.ErrLeaseLost)
	}
	if err := tx.Commit(ctx); err != nil {
		s.releaseAfterTxFailure(ctx, f)
		return wrap(ctx, "complete: commit", err)
	}
	if waiters { // after the commit: waiters must find the record completed
		s.notify(ctx, f.Scope, f.Key)
	}
	return nil
}

func (s *Store) releaseAfterTxFailure(ctx context.Context, f core.Fence) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if matched, waiters, err := fenced(fctx, s.pool, s.sql.fail, f.Scope, f.Key, f.Token); err == nil && matched && waiters {
		s.notify(fctx, f.Scope, f.Key)
	}
}
