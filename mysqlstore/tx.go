package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/core"
)

var (
	// ErrNoLease is returned by Tx when ctx does not belong to a handler
	// that idem let proceed (no core.Lease in the context).
	ErrNoLease = errors.New("mysqlstore: no idem lease in context: Tx must be called with the context of a handler idem let proceed")
	// ErrLeaseFinished is returned by Tx when the lease was already
	// completed or failed: its transaction, if any, is over.
	ErrLeaseFinished = errors.New("mysqlstore: the lease is finished; its transaction was committed or rolled back")
)

// txKey is the lease attachment under which the transaction state lives.
type txKey struct{}

// txState is attached to a lease once (by Tx or by Complete/Fail) and never
// removed: after Complete or Fail it stays as a tombstone (done, no tx), so a
// late Tx call from a leaked handler goroutine gets ErrLeaseFinished instead
// of opening a transaction nobody will ever end.
type txState struct {
	mu   sync.Mutex
	tx   *sql.Tx
	done bool
}

// rollbackTimeout bounds the clean-up statements that run on a context
// detached from the caller's (a cancelled request must not leave a
// connection inside a transaction, nor a record processing).
const rollbackTimeout = 5 * time.Second

// Tx returns the business transaction of the current idem execution,
// beginning it on first use: calling Tx twice with contexts carrying the same
// lease returns the same transaction. ctx must be (or derive from) the
// context of a handler idem let proceed; otherwise Tx returns ErrNoLease.
// The engine's store must be a *Store, or a decorator exposing it through
// an Unwrap() core.Store method.
//
// The handler runs its writes on the transaction and must neither commit
// nor roll it back (database/sql's *sql.Tx cannot be wrapped to refuse it,
// unlike pgstore's). When the engine commits the response, Store.Complete
// runs its fenced UPDATE inside this transaction and commits it: the
// business writes and the stored response are one atomic fact. If the lease
// was lost meanwhile (another instance took the key over), the fenced
// UPDATE matches nothing, the transaction is rolled back, the handler's
// writes vanish, and Complete returns core.ErrLeaseLost. On abort (handler
// error, panic, 5xx), Store.Fail rolls the transaction back.
//
// A handler that commits the transaction itself breaks that: its writes are
// then in the database whether or not it still owned the key. Complete then
// falls back to the plain fenced UPDATE.
//
// The transaction lives until Complete or Fail, not until ctx is cancelled
// (it is begun on a context without ctx's cancellation; each statement the
// handler runs on it still honours its own context). It holds a pool
// connection until then; see "Pool sizing" in the README (and WithTxDB).
func Tx(ctx context.Context) (*sql.Tx, error) {
	lease, ok := core.LeaseFromContext(ctx)
	if !ok {
		return nil, ErrNoLease
	}
	s := storeOf(lease)
	if s == nil {
		return nil, fmt.Errorf("mysqlstore: tx: the lease was granted by %T, not by a *mysqlstore.Store (or a store whose Unwrap returns one)", lease.Store())
	}
	st := attachState(lease)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return nil, ErrLeaseFinished
	}
	if st.tx == nil {
		if err := ctx.Err(); err != nil {
			return nil, wrap(ctx, "tx: begin", err)
		}
		// database/sql rolls a transaction back when its context ends; this
		// one must last until Complete or Fail, whatever the request does.
		tx, err := s.txDB.BeginTx(context.WithoutCancel(ctx), s.cfg.txOpts)
		if err != nil {
			return nil, wrap(ctx, "tx: begin", err)
		}
		st.tx = tx
	}
	return st.tx, nil
}

// storeOf returns the *Store that granted lease, looking through store
// decorators (metrics, tracing), or nil.
func storeOf(lease *core.Lease) *Store {
	s, _ := core.StoreAs[*Store](lease.Store())
	return s
}

func attachState(lease *core.Lease) *txState {
	v, _ := lease.Attach(txKey{}, func() (any, error) { return &txState{}, nil })
	return v.(*txState)
}

// takeTx finishes the lease's transaction state for fence f and returns the
// open transaction, if one was begun. It returns nil when ctx carries no
// lease of this store for f. Either way, from now on Tx refuses to begin one.
func (s *Store) takeTx(ctx context.Context, f core.Fence) *sql.Tx {
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
		// A failed rollback closes the connection, which ends the
		// transaction server-side just the same. ErrTxDone: the handler
		// ended it itself.
		_ = tx.Rollback()
	}
}

// completeInTx runs the fenced complete inside the handler's transaction and
// commits it; on any failure the transaction is rolled back.
//
// When it fails for a reason other than a lost lease, it also marks the
// record failed (fenced, best effort), so a retry may run the handler again
// at once instead of waiting for the lease to lapse. That is safe only
// because the handler's writes were in the transaction: they were rolled
// back with it. On Galera the COMMIT itself may fail certification (1213):
// same path, the writes did not land. (If the connection died during COMMIT
// and the commit did land, the record is completed and the fenced fail
// matches nothing.)
func (s *Store) completeInTx(ctx context.Context, tx *sql.Tx, f core.Fence, args []any) error {
	var (
		res sql.Result
		err error
	)
	if st := s.prepared(s.sql.complete); st != nil {
		res, err = tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	} else {
		// Not prepared yet: prepare on the transaction's own connection
		// (preparing on the pool could wait for a connection forever when
		// transactions hold them all).
		res, err = tx.ExecContext(ctx, s.sql.complete, args...)
	}
	if errors.Is(err, sql.ErrTxDone) {
		// The handler committed or rolled back the transaction itself (see
		// Tx): nothing left to make atomic; the plain fenced update.
		ok, err := s.fenced(ctx, s.sql.complete, args...)
		if err != nil {
			return wrap(ctx, "complete", err)
		}
		if !ok {
			return fmt.Errorf("mysqlstore: complete: %w", core.ErrLeaseLost)
		}
		return nil
	}
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		_ = tx.Rollback()
		s.releaseAfterTxFailure(ctx, f)
		return wrap(ctx, "complete (in transaction)", err)
	}
	if n == 0 {
		_ = tx.Rollback()
		return fmt.Errorf("mysqlstore: complete: %w (handler transaction rolled back)", core.ErrLeaseLost)
	}
	if err := tx.Commit(); err != nil {
		s.releaseAfterTxFailure(ctx, f)
		return wrap(ctx, "complete: commit", err)
	}
	return nil
}

func (s *Store) releaseAfterTxFailure(ctx context.Context, f core.Fence) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, _ = s.fenced(fctx, s.sql.fail, f.Scope, f.Key, f.Token)
}
