package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

var (
	// ErrNoLease is returned by Tx and Defer when ctx does not belong to a
	// handler that idem let proceed (no storekit.Lease in the context).
	ErrNoLease = errors.New("sqlitestore: no idem lease in context: Tx must be called with the context of a handler idem let proceed")
	// ErrLeaseFinished is returned by Tx and Defer when the lease was
	// already completed or failed: its transaction, if any, is over.
	ErrLeaseFinished = errors.New("sqlitestore: the lease is finished; its transaction was committed or rolled back")
	// ErrTxRolledBack is returned by Complete when the handler ended the
	// transaction Tx handed it so that its writes did not commit: the
	// response is not recorded, the key is released, and the engine
	// answers 500 (it wraps storekit.ErrNotCommitted).
	ErrTxRolledBack = fmt.Errorf("sqlitestore: the handler ended the lease transaction and its writes did not commit (leave Commit and Rollback of sqlitestore.Tx to idem): %w", storekit.ErrNotCommitted)
	// ErrStepInTx is returned by SaveStep while the lease's transaction
	// is open: it holds SQLite's only write lock, so a step could not be
	// made durable on its own. Run core.Step before the first Tx call.
	ErrStepInTx = errors.New("sqlitestore: save step: the lease transaction (Tx) holds SQLite's write lock; run core.Step before calling Tx")
)

// markTTL is how long Sweep keeps a commit mark left behind by a handler
// that committed itself and died before Complete, at least: it also keeps
// it as long as that record is processing under its token within
// retention, for the claim that takes it over (sweepMarks).
const markTTL = 24 * time.Hour

// rollbackTimeout bounds the clean-up statements that run on a context
// detached from the caller's.
const rollbackTimeout = 5 * time.Second

// Tx returns the business transaction of the current idem execution,
// beginning it on first use. ctx must be (or derive from) the context of a
// handler idem let proceed; otherwise ErrNoLease.
//
// The handler runs its writes on the transaction and must neither commit
// nor roll it back. Store.Complete runs its fenced UPDATE inside it and
// commits: the business writes and the stored response are one atomic
// fact. If the lease was lost meanwhile, the UPDATE matches nothing, the
// transaction rolls back and Complete returns core.ErrLeaseLost. Store.Fail
// rolls it back.
//
// SQLite has one writer per database. The transaction's first statement
// inserts the lease's commit mark, so it holds the write lock from Tx until
// Complete or Fail: every other write to the file (other keys' claims and
// completions, in every process) waits up to busy_timeout meanwhile, then
// fails. Keep work between Tx and the response short (call providers and
// run core.Step before Tx). Nothing deadlocks on the lease's own writes:
// its heartbeats run inside the transaction, and SaveStep refuses with
// ErrStepInTx instead of waiting for a lock its own execution holds.
//
// A handler that ends the transaction itself, through the *sql.Tx or with
// COMMIT or ROLLBACK sent as SQL, is detected as in mysqlstore: the commit
// mark, committed exactly with the handler's writes, says whether they
// landed. Absent: the response is not recorded, the key is released,
// Complete returns ErrTxRolledBack. Present: the response is recorded by a
// plain fenced UPDATE; a Fail completes the record as not retained; a
// takeover of a lapsed lease that finds the mark does the same instead of
// running the handler again. After a ROLLBACK sent as SQL (or a statement
// SQLite interrupted, which rolls the transaction back), do not write on
// the transaction: those statements autocommit, unseen, and the key is
// released all the same, so a retry runs them again.
func Tx(ctx context.Context) (*sql.Tx, error) {
	lease, s, err := sqlkit.Granted[*Store](ctx, ErrNoLease, "sqlitestore: tx")
	if err != nil {
		return nil, err
	}
	// The lease's state (sqlkit.LeaseState) is attached once and stays as a
	// tombstone after Complete or Fail: a late call gets ErrLeaseFinished.
	st := sqlkit.StateOf(lease)
	return st.Tx(ErrLeaseFinished, func() (*sql.Tx, bool, error) {
		if err := ctx.Err(); err != nil {
			return nil, false, wrap(ctx, "tx: begin", err)
		}
		tx, marked, err := s.beginLeaseTx(ctx, lease.Fence().Token)
		if err != nil {
			return nil, false, err
		}
		// Under st's lock still: takeTx finds it here (or through ctx) and
		// waits for Tx to return.
		s.txMu.Lock()
		s.txs[lease.Fence()] = st
		s.txMu.Unlock()
		return tx, marked, nil
	})
}

// beginLeaseTx begins the lease transaction and, unless it is read-only,
// inserts the commit mark as its first statement: a write, so SQLite's
// write lock is taken now (queued behind this Store's other writers, then
// under busy_timeout), before the transaction reads anything. The store's
// writer slot is released once the lock is held: the transaction keeps the
// lock, and other writers wait for it in SQLite (see Tx).
func (s *Store) beginLeaseTx(ctx context.Context, token int64) (*sql.Tx, bool, error) {
	marked := s.cfg.TxMarked()
	if marked {
		if err := s.wr.lock(ctx); err != nil {
			return nil, false, wrap(ctx, "tx: begin", err)
		}
		defer s.wr.unlock()
	}
	// It must last until Complete or Fail, whatever the request does.
	tx, err := s.txDB.BeginTx(context.WithoutCancel(ctx), s.cfg.TxOpts)
	if err != nil {
		return nil, false, wrap(ctx, "tx: begin", err)
	}
	if marked {
		if _, err := tx.ExecContext(ctx, s.sql.markIns, token); err != nil {
			_ = tx.Rollback()
			return nil, false, wrap(ctx, "tx: begin: commit mark", err)
		}
	}
	return tx, marked, nil
}

// openTx reports whether f's lease has a transaction open in this store.
func (s *Store) openTx(f storekit.Fence) *sqlkit.LeaseState {
	s.txMu.Lock()
	defer s.txMu.Unlock()
	return s.txs[f]
}

// heartbeatInTx runs the heartbeat inside f's lease transaction when one
// is open (inTx). A transaction the handler ended itself no longer holds
// the lock: the heartbeat then runs on the pool.
func (s *Store) heartbeatInTx(ctx context.Context, f storekit.Fence, args []any) (ok, inTx bool, err error) {
	st := s.openTx(f)
	if st == nil {
		return false, false, nil
	}
	st.InMarkedTx(func(tx *sql.Tx) {
		// Not interruptible: an interrupted write inside the transaction
		// would make SQLite roll the handler's writes back.
		res, xerr := tx.ExecContext(context.WithoutCancel(ctx), s.sql.heartbeat, args...)
		if errors.Is(xerr, sql.ErrTxDone) {
			return
		}
		inTx, err = true, xerr
		if err != nil {
			return
		}
		var n int64
		n, err = res.RowsAffected()
		ok = n > 0
	})
	return ok, inTx, err
}

// takeTx finishes the lease's transaction state for f and returns the open
// transaction, if any, whether it carries a commit mark, and the statements
// queued by Defer. The state is found through ctx's lease, or else through
// the store's table of open transactions (a Complete on a context without
// the lease must still end the transaction: it holds the write lock the
// plain UPDATE would wait for). From now on Tx and Defer refuse.
func (s *Store) takeTx(ctx context.Context, f storekit.Fence) (*sql.Tx, bool, []sqlkit.DeferredStmt) {
	s.txMu.Lock()
	st := s.txs[f]
	delete(s.txs, f)
	s.txMu.Unlock()
	if own := sqlkit.Owned(ctx, f, s); own != nil {
		st = own
	}
	if st == nil {
		return nil, false, nil
	}
	return st.Take()
}

// abandonTx rolls back the lease's transaction for f, if any, drops the
// deferred statements, and reports whether the handler had ended a marked
// transaction itself.
func (s *Store) abandonTx(ctx context.Context, f storekit.Fence) (handlerEnded bool) {
	tx, marked, _ := s.takeTx(ctx, f)
	if marked && tx != nil && endedBySQL(ctx, tx) {
		_ = tx.Rollback() // database/sql's side of it: SQLite has no transaction to end
		return true
	}
	return sqlkit.Abandon(tx, marked)
}

// endedBySQL reports whether the lease transaction ended behind
// database/sql's back: the handler sent COMMIT or ROLLBACK as SQL, or
// SQLite rolled it back for an interrupted statement. The connection is
// then in autocommit, where BEGIN succeeds (the probe's transaction, which
// took no lock, is rolled back at once); inside a transaction SQLite
// refuses it. The commit mark then tells which way it ended: it committed
// with the handler's writes, or went with them.
func endedBySQL(ctx context.Context, tx *sql.Tx) bool {
	sctx := context.WithoutCancel(ctx)
	if _, err := tx.ExecContext(sctx, "BEGIN"); err != nil {
		return false
	}
	_, _ = tx.ExecContext(sctx, "ROLLBACK")
	return true
}

// completeInTx deletes the commit mark, runs the fenced complete and then
// the deferred statements inside the handler's transaction, and commits
// it; on any failure it rolls back and releases the key (the handler's
// writes rolled back with it). The complete runs before the deferred
// statements so that a lost lease is found before any of them runs; in one
// transaction the order makes no other difference.
//
// SQLite ends a transaction on its own when one of its write statements is
// interrupted (modernc.org/sqlite interrupts a statement whose context is
// cancelled: a client that hangs up during the handler's INSERT) or when
// the handler sends ROLLBACK as SQL; database/sql does not know, and every
// later statement on the *sql.Tx would autocommit. So the mark's DELETE
// must find the mark: if it does not, the handler's writes rolled back and
// the response is refused (ErrTxRolledBack) before anything else runs.
// The store's own statements here run without ctx's cancellation, so that
// an interrupt cannot split them.
func (s *Store) completeInTx(ctx context.Context, tx *sql.Tx, marked bool, f storekit.Fence, deferred []sqlkit.DeferredStmt, args []any) error {
	sctx := context.WithoutCancel(ctx)
	if marked && endedBySQL(sctx, tx) {
		// The mark's DELETE below would autocommit, and remove the proof
		// of a COMMIT sent as SQL.
		_ = tx.Rollback()
		return s.completeAfterHandlerEnded(ctx, marked, f, deferred, args)
	}
	var err error
	if marked {
		var del sql.Result
		if del, err = tx.ExecContext(sctx, s.sql.markDel, f.Token); err == nil {
			if n, _ := del.RowsAffected(); n != 1 {
				_ = tx.Rollback()
				s.releaseAfterTxFailure(ctx, f)
				return fmt.Errorf("sqlitestore: complete: the lease transaction was rolled back by SQLite (an interrupted statement, or ROLLBACK sent as SQL): %w", ErrTxRolledBack)
			}
		}
	}
	var res sql.Result
	if err == nil {
		res, err = tx.ExecContext(sctx, s.sql.complete, args...)
	}
	if errors.Is(err, sql.ErrTxDone) {
		return s.completeAfterHandlerEnded(ctx, marked, f, deferred, args)
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
		return fmt.Errorf("sqlitestore: complete: %w (handler transaction rolled back)", core.ErrLeaseLost)
	}
	if err := execDeferred(sctx, tx, deferred); err != nil {
		_ = tx.Rollback()
		s.releaseAfterTxFailure(ctx, f)
		return deferredFailed(ctx, err)
	}
	if err := tx.Commit(); err != nil {
		s.releaseAfterTxFailure(ctx, f)
		return wrap(ctx, "complete: commit", err)
	}
	return nil
}

// completeAfterHandlerEnded records the response only if the commit mark
// says the handler's writes committed; otherwise releases the key. Deferred
// statements then run with the fenced complete in a transaction of their
// own; if they fail, the handler's writes stand and the record is completed
// as not retained.
func (s *Store) completeAfterHandlerEnded(ctx context.Context, marked bool, f storekit.Fence, deferred []sqlkit.DeferredStmt, args []any) error {
	if marked {
		committed, err := s.markCommitted(ctx, f.Token)
		if err != nil {
			return wrap(ctx, "complete: the handler ended the transaction: read its commit mark", err)
		}
		if !committed {
			s.releaseAfterTxFailure(ctx, f)
			return fmt.Errorf("sqlitestore: complete: %w", ErrTxRolledBack)
		}
	}
	if len(deferred) > 0 {
		// marked: the handler's writes committed (a read-only Tx has none).
		return s.completeDeferred(ctx, f, deferred, args, marked)
	}
	ok, err := s.fenced(ctx, s.sql.complete, args...)
	if err != nil {
		// The mark stays: if the record is still processing, the claim
		// that takes the lapsed lease over finds it and completes the
		// record as not retained instead of running the handler again.
		return wrap(ctx, "complete", err)
	}
	if marked {
		s.dropMark(ctx, f.Token)
	}
	if !ok {
		return fmt.Errorf("sqlitestore: complete: %w", core.ErrLeaseLost)
	}
	return nil
}

// failAfterHandlerCommitted completes the record as not retained when the
// mark says the handler's writes committed (a retry must not run them
// again), and reports whether it did.
func (s *Store) failAfterHandlerCommitted(ctx context.Context, f storekit.Fence) (committed bool, err error) {
	committed, err = s.markCommitted(ctx, f.Token)
	if err != nil || !committed {
		return false, err
	}
	ok, err := s.fenced(ctx, s.sql.complete, completeArgs(f, storekit.StoredResponse{Status: 500, NotRetained: true})...)
	if err != nil {
		// The mark stays, for the claim that takes the lapsed lease over
		// (see completeAfterHandlerEnded).
		return true, err
	}
	s.dropMark(ctx, f.Token)
	if !ok {
		return true, core.ErrLeaseLost
	}
	return true, nil
}

// markCommitted reports whether the commit mark of token is in the
// database. The handler's COMMIT has returned before Complete or Fail
// runs, so a plain read sees it.
func (s *Store) markCommitted(ctx context.Context, token int64) (bool, error) {
	st, err := s.stmt(ctx, s.sql.markRead)
	if err != nil {
		return false, err
	}
	var n int
	err = st.QueryRowContext(ctx, token).Scan(&n)
	return n > 0, err
}

// dropMark deletes a commit mark that landed (best effort: Sweep deletes
// what is left).
func (s *Store) dropMark(ctx context.Context, token int64) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, _ = s.db.ExecContext(fctx, s.sql.markDel, token)
}

func (s *Store) releaseAfterTxFailure(ctx context.Context, f storekit.Fence) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, _ = s.fenced(fctx, s.sql.fail, b(f.Scope), b(f.Key), f.Token)
}
