package sqlkit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/idemkit/idem/core/storekit"
)

// DeferredStmt is one statement a handler queued with the store's Defer
// (LeaseState.Defer), to run with the fenced complete.
type DeferredStmt struct {
	Query string // the SQL text, in the driver's placeholder syntax
	Args  []any  // its arguments, as the handler passed them
}

// LeaseState is the Tx/Defer state of one lease: the transaction the
// store's Tx hands the handler and the statements its Defer queued. It is
// attached to the lease once (by Tx, Defer, or Complete/Fail) and never
// removed: after Take it stays as a tombstone (done, no tx, nothing
// deferred), so a late Tx or Defer call from a leaked handler goroutine is
// refused instead of opening a transaction nobody will ever end or
// queueing a statement nobody will ever send.
type LeaseState struct {
	mu       sync.Mutex
	tx       *sql.Tx
	deferred []DeferredStmt // Defer's, in order
	done     bool
	// marked: the transaction's first statement inserted the commit mark
	// (every transaction but a read-only one).
	marked bool
}

// stateKey is the lease attachment under which the LeaseState lives.
type stateKey struct{}

// StateOf returns lease's LeaseState, attaching an empty one on first use.
func StateOf(lease storekit.Lease) *LeaseState {
	v, _ := lease.Attach(stateKey{}, func() (any, error) { return &LeaseState{}, nil })
	return v.(*LeaseState)
}

// Granted returns the lease ctx carries and the store of type S that
// granted it (looking through store decorators). Without a lease it
// returns noLease; with one another store granted, an error under what
// (e.g. "mysqlstore: tx") naming both stores' types.
func Granted[S comparable](ctx context.Context, noLease error, what string) (storekit.Lease, S, error) {
	var zero S
	lease, ok := storekit.LeaseFromContext(ctx)
	if !ok {
		return nil, zero, noLease
	}
	s, _ := storekit.As[S](lease.Store())
	if s == zero {
		return nil, zero, fmt.Errorf("%s: the lease was granted by %T, not by a %T (or a store whose Unwrap returns one)", what, lease.Store(), zero)
	}
	return lease, s, nil
}

// Owned returns the LeaseState of the lease ctx carries when that lease is
// for fence f and was granted by s (looking through store decorators), or
// nil.
func Owned[S comparable](ctx context.Context, f storekit.Fence, s S) *LeaseState {
	lease, ok := storekit.LeaseFromContext(ctx)
	if !ok || lease.Fence() != f {
		return nil
	}
	if granted, _ := storekit.As[S](lease.Store()); granted != s {
		return nil
	}
	return StateOf(lease)
}

// Tx returns the lease's transaction, calling begin on first use, under
// the state's lock (two calls cannot both begin one). begin returns the
// transaction and whether it carries a commit mark. Once the state is
// taken, Tx returns finished.
func (st *LeaseState) Tx(finished error, begin func() (tx *sql.Tx, marked bool, err error)) (*sql.Tx, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return nil, finished
	}
	if st.tx == nil {
		tx, marked, err := begin()
		if err != nil {
			return nil, err
		}
		st.tx, st.marked = tx, marked
	}
	return st.tx, nil
}

// Defer queues a statement; once the state is taken it returns finished.
func (st *LeaseState) Defer(finished error, query string, args []any) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return finished
	}
	st.deferred = append(st.deferred, DeferredStmt{Query: query, Args: args})
	return nil
}

// Take finishes the state and hands over the open transaction (nil if none
// was begun), whether it carries a commit mark, and the queued statements.
// From now on Tx and Defer refuse.
func (st *LeaseState) Take() (tx *sql.Tx, marked bool, deferred []DeferredStmt) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.done = true
	tx, deferred = st.tx, st.deferred
	st.tx, st.deferred = nil, nil
	return tx, st.marked, deferred
}

// MarkedTxOpen reports whether the lease has an open marked transaction
// (Tx began one that writes; Take has not run).
func (st *LeaseState) MarkedTxOpen() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.tx != nil && st.marked
}

// InMarkedTx runs fn on the open marked transaction under the state's lock
// (Take waits for it), and reports whether there was one.
func (st *LeaseState) InMarkedTx(fn func(*sql.Tx)) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.tx == nil || !st.marked {
		return false
	}
	fn(st.tx)
	return true
}

// Abandon rolls back tx (from Take), if any, and reports whether the
// handler had ended a marked transaction itself (the rollback found it
// done): then whether its writes committed is for the mark to say. A
// failed rollback closes the connection, which ends the transaction
// server-side just the same.
func Abandon(tx *sql.Tx, marked bool) (handlerEnded bool) {
	if tx == nil {
		return false
	}
	err := tx.Rollback()
	return marked && errors.Is(err, sql.ErrTxDone)
}
