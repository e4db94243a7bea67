package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// Defer queues a write of the current idem execution to run when idem
// stores its response, in the same transaction as the stored response. It
// is for business writes whose result the handler does not need before it
// answers: a ledger row, an outbox message, a counter. Unlike Tx, it takes
// no lock while the handler runs: SQLite's only write lock is held for the
// complete's own short transaction, not during the handler's provider
// call or other slow work, so other keys' claims and completions (in every
// process) do not wait for the handler. It sends nothing and takes no
// connection.
//
// ctx is the handler's context, as for Tx, which returns the same errors
// (ErrNoLease, ErrLeaseFinished). What happens to a queued statement:
//
//   - It runs only if the engine completes the key with the handler's
//     response (a final status). When the key is released instead (a
//     retryable status, a handler error or panic, a client that went away),
//     it never runs.
//   - Statements run in the order they were queued, after everything the
//     handler ran through Tx, in Tx's transaction if the handler began one;
//     otherwise in a write transaction with the fenced complete, which
//     may be shared with other requests' writes queued beside it, each in
//     a savepoint of its own (group commit: writer.go).
//   - If one fails (a constraint, an error it raises) the whole transaction
//     rolls back: the other queued statements, the writes made through Tx
//     and the response are not stored. The key is released (a retry runs
//     the handler again) and the engine answers 500 instead of the
//     handler's response; the error wraps storekit.ErrNotCommitted and is
//     logged by the engine.
//   - If the lease was lost meanwhile, it rolls back with the rest (the
//     complete fails with core.ErrLeaseLost).
//
// args are converted when the statement runs, not when it is queued: do
// not modify a slice or map passed as an argument after queueing it. A
// deferred statement must not end the transaction (COMMIT, ROLLBACK, END).
func Defer(ctx context.Context, query string, args ...any) error {
	lease, _, err := sqlkit.Granted[*Store](ctx, ErrNoLease, "sqlitestore: defer")
	if err != nil {
		return err
	}
	return sqlkit.StateOf(lease).Defer(ErrLeaseFinished, query, args)
}

// execDeferred runs the deferred statements on tx, in order, and stops at
// the first that fails. Not interruptible (sctx): an interrupted write
// would make SQLite end the transaction behind database/sql's back.
func execDeferred(sctx context.Context, tx *sql.Tx, deferred []sqlkit.DeferredStmt) error {
	for i, d := range deferred {
		if _, err := tx.ExecContext(sctx, d.Query, d.Args...); err != nil {
			return fmt.Errorf("deferred statement %d of %d: %w", i+1, len(deferred), err)
		}
	}
	return nil
}

// deferredFailed reports deferred statements that failed before the
// commit: nothing of the transaction committed, and the caller released
// the key. A statement the database refused (or could not bind) is the
// handler's write failing: storekit.ErrNotCommitted, the engine answers
// 500. A transaction database/sql ended because ctx did (the commit
// timeout) is the store's failure to record: a plain error (503).
func deferredFailed(ctx context.Context, err error) error {
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return wrap(ctx, "complete (deferred statements)", err)
	}
	return fmt.Errorf("%w: %w", storekit.ErrNotCommitted, wrap(ctx, "complete (deferred statements)", err))
}

// completeDeferred runs the fenced complete and the deferred statements in
// one write transaction of its own (no Tx was begun): the write lock is
// taken here, at the end of the execution, not while the handler ran. The
// complete goes first: its UPDATE takes the write lock before the
// transaction reads anything (without _txlock=immediate too), and a lost
// lease is found before any deferred statement runs.
//
// Failures as in completeInTx: a lost lease rolls back (ErrLeaseLost); a
// failed statement rolls back and releases the key; a failed COMMIT
// releases the key too (the fenced fail matches nothing if it landed).
// handlerCommitted says the handler committed its Tx itself: its writes
// stand whatever happens here, so after a failure the record is completed
// as not retained instead of released, as Fail does then (see Tx): a retry
// must not run them again. Its commit mark is deleted once the record is
// completed (or was moved on by another owner), and kept otherwise.
func (s *Store) completeDeferred(ctx context.Context, f storekit.Fence, deferred []sqlkit.DeferredStmt, args []any, handlerCommitted bool) error {
	var lost, deferredFailedErr bool
	fn := func(ctx context.Context, tx *sql.Tx) error {
		lost, deferredFailedErr = false, false
		res, err := tx.ExecContext(ctx, s.sql.complete, args...)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil {
			return err
		}
		if n == 0 {
			lost = true
			return errDiscard
		}
		if err := execDeferred(ctx, tx, deferred); err != nil {
			deferredFailedErr = true
			return err
		}
		return nil
	}
	var err error
	if s.txDB == s.db {
		// Shared with the writes queued beside it (writer.go).
		err = s.wr.write(ctx, fn)
	} else if err = s.wr.lock(ctx); err == nil {
		// Tx's own database: a transaction of its own, the key's release
		// after a failure taking the slot itself once it is given back.
		err = runTx(ctx, s.txDB, fn)
		s.wr.unlock()
	}
	switch {
	case lost && err == nil:
		if handlerCommitted {
			s.dropMark(ctx, f.Token)
		}
		return fmt.Errorf("sqlitestore: complete: %w (deferred statements not run)", core.ErrLeaseLost)
	case err == nil:
		if handlerCommitted {
			s.dropMark(ctx, f.Token)
		}
		return nil
	}
	if handlerCommitted {
		// The mark goes only once the record is completed (or another
		// owner moved it on); otherwise the claim that takes the lapsed
		// lease over finds it and completes the record as not retained.
		// Not ErrNotCommitted: the handler's writes did commit, and the
		// key is not released (as mysqlstore answers).
		settled := s.completeNotRetained(ctx, f)
		if settled {
			s.dropMark(ctx, f.Token)
			return wrap(ctx, "complete: the deferred statements' transaction failed after the handler committed its own (the record is completed as not retained)", err)
		}
		return wrap(ctx, "complete: the deferred statements' transaction failed after the handler committed its own, and completing the record as not retained failed too", err)
	}
	s.releaseAfterTxFailure(ctx, f)
	switch {
	case deferredFailedErr:
		return deferredFailed(ctx, err)
	case errors.Is(err, errCommit):
		return wrap(ctx, "complete", err)
	default:
		return wrap(ctx, "complete (in transaction)", err)
	}
}

// completeNotRetained completes f's record as not retained after deferred
// statements failed behind a handler that committed its Tx itself. Best
// effort: it reports whether the record is settled (completed now, or the
// fence matched nothing: another owner moved it on), so that the caller
// keeps the commit mark otherwise.
func (s *Store) completeNotRetained(ctx context.Context, f storekit.Fence) (settled bool) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, err := s.fenced(fctx, s.sql.complete, completeArgs(f, storekit.StoredResponse{Status: 500, NotRetained: true})...)
	return err == nil
}
