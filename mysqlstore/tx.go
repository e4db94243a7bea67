package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

var (
	// ErrNoLease is returned by Tx and Defer when ctx does not belong to a
	// handler that idem let proceed (no storekit.Lease in the context).
	ErrNoLease = errors.New("mysqlstore: no idem lease in context: Tx and Defer must be called with the context of a handler idem let proceed")
	// ErrLeaseFinished is returned by Tx and Defer when the lease was
	// already completed or failed: its transaction, if any, is over.
	ErrLeaseFinished = errors.New("mysqlstore: the lease is finished; its transaction was committed or rolled back")
	// ErrTxRolledBack is returned by Complete when the handler ended the
	// transaction Tx handed it (a Rollback, often a deferred one, or a
	// failed Commit) so that its writes did not commit: the response is
	// not recorded, the key is released, and the engine answers 500
	// (it wraps storekit.ErrNotCommitted).
	ErrTxRolledBack = fmt.Errorf("mysqlstore: the handler ended the lease transaction and its writes did not commit (leave Commit and Rollback of mysqlstore.Tx to idem): %w", storekit.ErrNotCommitted)
	// ErrTxRolledByServer is returned by Complete when the server rolled
	// the transaction Tx handed the handler back before Complete (a
	// deadlock inside it, a ROLLBACK sent as SQL): the response is not
	// recorded, and since the handler's statements after that rollback
	// autocommitted (database/sql cannot tell), the key is not released
	// either: the record is completed as not retained (retries answer 409
	// not-retained; the engine answers 503). Fail does the same, and
	// returns nil.
	ErrTxRolledByServer = errors.New("mysqlstore: the server rolled the lease transaction back (a deadlock or ROLLBACK inside it); statements the handler ran on it after that autocommitted, if any, so the record is completed as not retained")
)

// markTTL is how long Sweep keeps a commit mark (migration 0005) left
// behind, at least. A mark is read by the execution that wrote it, at its
// Complete or Fail (a day is far beyond any handler's transaction), and by
// the claim that takes its record over after a crash: Sweep keeps it as
// long as that record is processing under its token (sweepMarks).
const markTTL = 24 * time.Hour

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
// A handler that ends the transaction itself cannot make its writes and
// the response one fact any more. Tx makes the outcome known instead: it
// begins the transaction with the insert of a commit mark (one small row,
// migration 0005), which commits exactly when the handler's writes do.
// When Complete finds the transaction ended, it reads the mark:
//
//   - absent (the handler rolled back, e.g. with the idiomatic
//     `defer tx.Rollback()`, or its Commit failed):
//     the writes did not land, so the response is NOT recorded; the key is released (a retry
//     runs the handler again) and Complete returns ErrTxRolledBack, which
//     the engine answers with a 500 instead of the handler's response;
//   - present (the handler committed): the response is recorded by a plain
//     fenced UPDATE, and retries replay it. The handler gave up the fence,
//     though: its writes are in the database whether or not it still owned
//     the key. If its process dies before Complete, the claim that would
//     take the lapsed lease over finds the mark and completes the record
//     as not retained instead (migration 0006): the handler never runs
//     twice.
//
// Likewise, when Fail finds that the handler committed before failing, it
// does not release the key (a retry would run committed writes again): it
// completes the record as not retained, and retries answer 409
// not-retained. A read-only transaction (WithTxOptions) writes no mark.
//
// If the server rolled the transaction back behind database/sql's back (a
// deadlock inside it the handler went past, ROLLBACK sent as SQL), every
// later statement on it autocommitted: the response is not recorded and
// the key is not released (a retry would run those statements again); the
// record is completed as not retained (ErrTxRolledByServer).
//
// Do not send COMMIT or BEGIN as SQL on the transaction, nor a statement
// that commits implicitly (DDL, LOCK TABLES), either: the server commits
// it, and the mark with it, and goes on outside it. The mark then counts
// it as committed by the handler: the response is recorded, Fail completes
// the record as not retained, the key is never released; but the fence is
// gone, and statements queued by Defer autocommit one by one.
//
// The transaction lives until Complete or Fail, not until ctx is cancelled
// (it is begun on a context without ctx's cancellation; each statement the
// handler runs on it still honours its own context). It holds a pool
// connection until then; see "Pool sizing" in the README (and WithTxPool).
func Tx(ctx context.Context) (*sql.Tx, error) {
	lease, s, err := sqlkit.Granted[*Store](ctx, ErrNoLease, "mysqlstore: tx")
	if err != nil {
		return nil, err
	}
	// The lease's state (sqlkit.LeaseState) is attached once and stays as a
	// tombstone after Complete or Fail: a late call gets ErrLeaseFinished.
	return sqlkit.StateOf(lease).Tx(ErrLeaseFinished, func() (*sql.Tx, bool, error) {
		if err := ctx.Err(); err != nil {
			return nil, false, wrap(ctx, "tx: begin", err)
		}
		if s.cfg.causal && s.txDB != s.db && (s.galera.Load() || s.forceCausal) {
			// The claim committed through the store's own node; the
			// transaction runs on another (WithTxPool). Wait until that
			// node has applied the claim, or the fenced UPDATE at
			// Complete would not see it and refuse the owner as a stale
			// one. The wait runs before BEGIN, on the same pool: as a
			// prefix of the first statement inside the transaction it
			// did not help (tests/galera TestTxHandlerEnds, under load).
			// One round trip more, on Galera with WithTxPool only.
			if _, err := s.txDB.ExecContext(ctx, "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT 1"); err != nil {
				return nil, false, wrap(ctx, "tx: causal wait", err)
			}
		}
		marked := s.cfg.TxMarked()
		if marked {
			// Complete's statement in this transaction, prepared on its
			// pool once per Store (here a connection is taken anyway).
			if _, err := s.txStmts.Get(ctx, s.sql.completeMarked); err != nil {
				return nil, false, wrap(ctx, "tx: prepare complete", err)
			}
		}
		// database/sql rolls a transaction back when its context ends; this
		// one must last until Complete or Fail, whatever the request does.
		tx, err := s.txDB.BeginTx(context.WithoutCancel(ctx), s.cfg.TxOpts)
		if err != nil {
			return nil, false, wrap(ctx, "tx: begin", err)
		}
		if marked {
			if _, err := tx.ExecContext(ctx, s.markSQL(s.sql.markIns, lease.Fence().Token)+")"); err != nil {
				_ = tx.Rollback()
				return nil, false, wrap(ctx, "tx: begin: commit mark", err)
			}
		}
		return tx, marked, nil
	})
}

// markSQL completes a commit-mark statement with token.
func (s *Store) markSQL(prefix string, token int64) string {
	return string(strconv.AppendInt([]byte(prefix), token, 10))
}

// markCommitted reports whether the commit mark of token is in the
// database: whether the transaction of that lease committed. The read is
// causal on Galera whatever WithCausalReads says (the handler may have
// committed through another node a moment ago), and locking, so that a
// commit still in flight on this server is waited for.
func (s *Store) markCommitted(ctx context.Context, token int64) (bool, error) {
	q := s.sql.markRead
	if s.galera.Load() || s.forceCausal {
		q = "SET STATEMENT wsrep_sync_wait = 1 FOR " + q
	}
	st, err := s.stmt(ctx, q)
	if err != nil {
		return false, err
	}
	var n int
	err = s.withRetry(ctx, func() error { return st.QueryRowContext(ctx, token).Scan(&n) })
	return n > 0, err
}

// dropMark deletes a commit mark that landed (best effort: Sweep deletes
// what is left).
func (s *Store) dropMark(ctx context.Context, token int64) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, _ = s.db.ExecContext(fctx, s.markSQL(s.sql.markDel, token))
}

// takeTx finishes the lease's transaction state for fence f and returns the
// open transaction, if one was begun, whether it carries a commit mark, and
// the statements queued by Defer. It returns nil, false, nil when ctx
// carries no lease of this store for f. Either way, from now on Tx and Defer
// refuse.
func (s *Store) takeTx(ctx context.Context, f storekit.Fence) (*sql.Tx, bool, []sqlkit.DeferredStmt) {
	st := sqlkit.Owned(ctx, f, s)
	if st == nil {
		return nil, false, nil
	}
	return st.Take()
}

// abandonTx rolls back the lease's transaction for f, if any, and drops the
// deferred statements. It reports whether the handler had ended a marked
// transaction itself (the rollback found it done): then whether its writes
// committed is for the mark to say.
func (s *Store) abandonTx(ctx context.Context, f storekit.Fence) (handlerEnded bool) {
	tx, marked, _ := s.takeTx(ctx, f)
	return sqlkit.Abandon(tx, marked)
}

// completeInTx runs the fenced complete inside the handler's transaction,
// deletes the commit mark, runs the deferred statements, and commits it; on
// any failure the transaction is rolled back. (The mark is deleted before
// the commit: on this path it never lands. Complete and delete are two
// round trips: the driver sends one statement at a time.)
//
// When it fails for a reason other than a lost lease, it also marks the
// record failed (fenced, best effort), so a retry may run the handler again
// at once instead of waiting for the lease to lapse. That is safe only
// because the handler's writes were in the transaction: they were rolled
// back with it. On Galera the COMMIT itself may fail certification (1213):
// same path, the writes did not land. (If the connection died during COMMIT
// and the commit did land, the record is completed and the fenced fail
// matches nothing.) A deferred statement the server refused is reported
// with storekit.ErrNotCommitted (completeFailed).
//
// The server may have ended the transaction on its own, database/sql does
// not know, and every statement on tx then autocommits. The fenced complete
// matches only while the commit mark is there, so the mark decides:
// rolled back (ROLLBACK sent as SQL, a deadlock or Galera abort the handler
// went past), the mark went with the writes, the complete records nothing,
// and the record is completed as not retained before anything else runs
// (endAfterServerRollback); committed (a statement that commits implicitly: DDL,
// LOCK TABLES), the mark landed with the writes, the response is recorded,
// and whatever fails after, the key is never released (the fail statement
// refuses a record whose mark landed).
func (s *Store) completeInTx(ctx context.Context, tx *sql.Tx, marked bool, f storekit.Fence, deferred []sqlkit.DeferredStmt, args []any) error {
	if !marked { // a read-only transaction
		// The server refuses the fenced update inside a read-only
		// transaction (1792), and there is nothing to commit with it:
		// end the transaction and complete as for a handler that ended
		// it (unmarked: the plain fenced update, or the deferred
		// statements' own transaction).
		_ = tx.Rollback()
		return s.completeAfterHandlerEnded(ctx, false, f, deferred, args)
	}
	var (
		res sql.Result
		err error
	)
	if st := s.txStmts.Prepared(s.sql.completeMarked); st != nil {
		res, err = tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	} else {
		// Not prepared (Tx prepares it; a failed prepare): prepare on the
		// transaction's own connection (preparing on the pool could wait
		// for a connection forever when transactions hold them all).
		res, err = tx.ExecContext(ctx, s.sql.completeMarked, args...)
	}
	if errors.Is(err, sql.ErrTxDone) {
		// The handler committed or rolled back the transaction itself.
		return s.completeAfterHandlerEnded(ctx, marked, f, deferred, args)
	}
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 0 {
		_ = tx.Rollback()
		// The lease was lost, or the server rolled the transaction back
		// and the mark with it (see above): the fenced update below
		// matches only the latter.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		return s.endAfterServerRollback(fctx, "complete", f)
	}
	if err == nil {
		var del sql.Result
		if del, err = tx.ExecContext(ctx, s.markSQL(s.sql.markDel, f.Token)); err == nil {
			if n, _ := del.RowsAffected(); n != 1 {
				err = errors.New("the commit mark vanished from the transaction")
			}
		}
	}
	if err == nil {
		err = runDeferred(ctx, tx, deferred, nil)
	}
	if err != nil {
		_ = tx.Rollback()
		return s.completeFailed(ctx, f, err)
	}
	if err := tx.Commit(); err != nil {
		s.releaseAfterTxFailure(ctx, f)
		return wrap(ctx, "complete: commit", err)
	}
	return nil
}

// endAfterServerRollback ends the record of f when the server rolled the
// lease transaction back behind database/sql's back (a deadlock or a
// ROLLBACK sent as SQL inside it). Its writes until then rolled back, but
// every statement the handler ran on tx after that autocommitted (a
// handler that ignored the deadlock and went on booking): releasing the
// key would let a retry run those again. The record is completed as not
// retained instead (retries answer 409 not-retained). When the fenced
// update matches nothing, the lease was lost.
func (s *Store) endAfterServerRollback(ctx context.Context, op string, f storekit.Fence) error {
	err := s.completeNotRetained(ctx, f)
	switch {
	case errors.Is(err, core.ErrLeaseLost):
		return fmt.Errorf("mysqlstore: %s: %w (handler transaction rolled back)", op, err)
	case err != nil:
		return wrap(ctx, op+": the server rolled the lease transaction back; complete the record as not retained", err)
	}
	return fmt.Errorf("mysqlstore: %s: %w", op, ErrTxRolledByServer)
}

// completeAfterHandlerEnded completes a record whose handler ended the
// lease transaction itself (see Tx): recorded only if the commit mark says
// the writes committed (with the deferred statements, in a transaction of
// their own); otherwise released, and ErrTxRolledBack.
func (s *Store) completeAfterHandlerEnded(ctx context.Context, marked bool, f storekit.Fence, deferred []sqlkit.DeferredStmt, args []any) error {
	if marked {
		committed, err := s.markCommitted(ctx, f.Token)
		if err != nil {
			// Unknown: neither record (the writes may have rolled back)
			// nor release (they may have committed).
			return wrap(ctx, "complete: the handler ended the transaction: read its commit mark", err)
		}
		if !committed {
			s.releaseAfterTxFailure(ctx, f)
			return fmt.Errorf("mysqlstore: complete: %w", ErrTxRolledBack)
		}
		if len(deferred) > 0 {
			return s.completeDeferredAfterHandlerCommitted(ctx, f, deferred, args)
		}
	}
	// The writes committed (or a read-only transaction had none): the
	// plain fenced update, or the deferred statements' transaction.
	if len(deferred) > 0 {
		return s.completeDeferred(ctx, f, deferred, args)
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
		return fmt.Errorf("mysqlstore: complete: %w", core.ErrLeaseLost)
	}
	return nil
}

// failAfterHandlerCommitted is Fail for a handler that ended its marked
// transaction itself. If the mark says its writes committed, releasing the
// key would let a retry run them again: the record is completed as not
// retained instead (retries answer 409 not-retained), and committed is true.
func (s *Store) failAfterHandlerCommitted(ctx context.Context, f storekit.Fence) (committed bool, err error) {
	committed, err = s.markCommitted(ctx, f.Token)
	if err != nil || !committed {
		return false, err
	}
	err = s.completeNotRetained(ctx, f)
	if err == nil || errors.Is(err, core.ErrLeaseLost) {
		// Otherwise the mark stays, for the claim that takes the lapsed
		// lease over (see completeAfterHandlerEnded).
		s.dropMark(ctx, f.Token)
	}
	return true, err
}

// completeNotRetained completes the record of f as not retained (retries
// answer 409 not-retained): the end of an execution whose writes committed
// but whose response must not be recorded.
func (s *Store) completeNotRetained(ctx context.Context, f storekit.Fence) error {
	ok, err := s.fenced(ctx, s.sql.complete, completeArgs(f, storekit.StoredResponse{Status: 500, NotRetained: true})...)
	if err != nil {
		return err
	}
	if !ok {
		return core.ErrLeaseLost
	}
	return nil
}

func (s *Store) releaseAfterTxFailure(ctx context.Context, f storekit.Fence) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, _ = s.fenced(fctx, s.sql.fail, f.Scope, f.Key, f.Token)
}
