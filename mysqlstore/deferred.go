package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// Defer queues a write of the current idem execution to run when idem
// stores its response, in the same transaction as the stored response. It
// is for business writes whose result the handler does not need before it
// answers: a ledger row, an outbox message, a counter. database/sql sends
// one statement at a time, so Defer saves no round trip (unlike
// pgstore.Defer); what it saves is the transaction: none is open, and no
// connection is held, while the handler runs (a provider call, say), and
// the writes still commit atomically with the response. Without Tx, the
// store keeps the statement prepared (up to 64 distinct queries; build
// queries with placeholders, not per request): one round trip each.
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
//     otherwise in a transaction Complete begins for them on the store's
//     pool, with the server's default options. Either way they are sent
//     after the fenced complete matched: a stale owner's are never sent.
//   - If one fails (the server refuses it: a constraint, an error it
//     raises) the whole transaction rolls back: the other queued
//     statements, the writes made through Tx and the response are not
//     stored. The key is released (a retry runs the handler again) and the
//     engine answers 500 instead of the handler's response; the error wraps
//     storekit.ErrNotCommitted and is logged by the engine. Without Tx, a
//     deadlock or Galera certification conflict (1213) or a lock wait
//     timeout (1205) first runs the whole transaction again, as
//     WithDeadlockRetries says.
//   - If the lease was lost meanwhile, it rolls back with the rest (the
//     complete fails with core.ErrLeaseLost).
//
// A statement that commits implicitly (DDL, LOCK TABLES) must not be
// deferred: it would commit the transaction in the middle. args are
// converted when the statement is sent, not when it is queued: do not
// modify a slice or map passed as an argument after queueing it.
func Defer(ctx context.Context, query string, args ...any) error {
	lease, _, err := sqlkit.Granted[*Store](ctx, ErrNoLease, "mysqlstore: defer")
	if err != nil {
		return err
	}
	return sqlkit.StateOf(lease).Defer(ErrLeaseFinished, query, args)
}

// deferredError is a deferred statement that failed; refused says the
// server answered it with an error (the transaction did not commit, since
// COMMIT was never sent), rather than the connection failing.
type deferredError struct {
	err     error
	refused bool
}

func (e *deferredError) Error() string { return e.err.Error() }
func (e *deferredError) Unwrap() error { return e.err }

// runDeferred sends the deferred statements on tx, in order, and stops at
// the first that fails. prepared (deferredStmts; nil for none) has a
// statement kept prepared for some: each of those is one round trip,
// prepared once per connection, where database/sql alone prepares,
// executes and closes a statement with arguments on every run (two round
// trips).
func runDeferred(ctx context.Context, tx *sql.Tx, deferred []sqlkit.DeferredStmt, prepared []*sql.Stmt) error {
	for i, d := range deferred {
		var err error
		if i < len(prepared) && prepared[i] != nil {
			_, err = tx.StmtContext(ctx, prepared[i]).ExecContext(ctx, d.Args...)
		} else {
			_, err = tx.ExecContext(ctx, d.Query, d.Args...)
		}
		if err != nil {
			return &deferredError{err: err, refused: serverRefused(err)}
		}
	}
	return nil
}

// maxDeferredStmts bounds the deferred queries a Store keeps prepared:
// each holds a server-side statement per connection
// (max_prepared_stmt_count is server-wide), and queries built per request
// must not fill the cache.
const maxDeferredStmts = 64

// deferredStmts returns the deferred queries prepared in the store's
// cache, preparing those it may keep (up to maxDeferredStmts in all); nil
// for the others, and for any the server refuses to prepare (sent
// unprepared, it fails in the transaction as before). It runs before the
// transaction begins: preparing takes a connection of the pool, which a
// transaction holding one must not wait for.
func (s *Store) deferredStmts(ctx context.Context, deferred []sqlkit.DeferredStmt) []*sql.Stmt {
	out := make([]*sql.Stmt, len(deferred))
	for i, d := range deferred {
		if out[i] = s.stmts.Prepared(d.Query); out[i] != nil {
			continue
		}
		if s.deferredKept.Add(1) > maxDeferredStmts {
			s.deferredKept.Add(-1)
			continue
		}
		st, err := s.stmts.Get(ctx, d.Query)
		if err != nil {
			s.deferredKept.Add(-1)
			continue
		}
		out[i] = st
	}
	return out
}

// serverRefused reports whether err is the server's answer refusing a
// statement (an error packet), as opposed to the driver losing the
// connection.
func serverRefused(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me)
}

// completeDeferred runs the fenced complete and then the deferred
// statements in one transaction on the store's pool (deferredTx).
func (s *Store) completeDeferred(ctx context.Context, f storekit.Fence, deferred []sqlkit.DeferredStmt, args []any) error {
	lost, err := s.deferredTx(ctx, deferred, args)
	switch {
	case lost:
		return fmt.Errorf("mysqlstore: complete: %w (deferred statements rolled back)", core.ErrLeaseLost)
	case err != nil:
		return s.completeFailed(ctx, f, err)
	}
	return nil
}

// completeDeferredAfterHandlerCommitted is completeDeferred for a handler
// that committed its Tx transaction itself (see Tx): its writes are in
// whatever happens now, so the key is never released (a retry would run
// them again). If a deferred statement is refused, the record is completed
// as not retained, as Fail does for such a handler. If the outcome is
// unknown, the commit mark stays: the claim that takes the lapsed lease
// over finds it and does the same.
func (s *Store) completeDeferredAfterHandlerCommitted(ctx context.Context, f storekit.Fence, deferred []sqlkit.DeferredStmt, args []any) error {
	lost, err := s.deferredTx(ctx, deferred, args)
	switch {
	case lost:
		s.dropMark(ctx, f.Token)
		return fmt.Errorf("mysqlstore: complete: %w (deferred statements rolled back)", core.ErrLeaseLost)
	case err == nil:
		s.dropMark(ctx, f.Token)
		return nil
	case !isRefused(err):
		return wrap(ctx, "complete (deferred statements, after the handler committed its transaction)", err)
	}
	switch serr := s.completeNotRetained(ctx, f); {
	case errors.Is(serr, core.ErrLeaseLost):
		s.dropMark(ctx, f.Token)
		return fmt.Errorf("mysqlstore: complete: %w (deferred statements rolled back)", core.ErrLeaseLost)
	case serr != nil:
		return wrap(ctx, "complete: a deferred statement was refused after the handler committed its transaction; complete as not retained", errors.Join(err, serr))
	}
	s.dropMark(ctx, f.Token)
	return wrap(ctx, "complete: a deferred statement was refused after the handler committed its transaction (the record is completed as not retained)", err)
}

// deferredTx runs the fenced complete and then the deferred statements in
// one transaction on the store's pool, and commits it; lost reports that
// the fence matched nothing (nothing sent after it). A deadlock or
// certification conflict runs the whole transaction again (nothing of it
// committed, and every statement in it is the store's to send).
func (s *Store) deferredTx(ctx context.Context, deferred []sqlkit.DeferredStmt, args []any) (lost bool, err error) {
	complete, err := s.stmt(ctx, s.sql.complete)
	if err != nil {
		return false, err
	}
	prepared := s.deferredStmts(ctx, deferred)
	err = s.withRetry(ctx, func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		res, err := tx.StmtContext(ctx, complete).ExecContext(ctx, args...)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err == nil && n == 0 {
			lost = true
		}
		if err == nil && !lost {
			err = runDeferred(ctx, tx, deferred, prepared)
		}
		if err != nil || lost {
			// A failed rollback closes the connection, which ends the
			// transaction server-side just the same.
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
	return lost, err
}

// isRefused reports whether err is a deferred statement the server refused.
func isRefused(err error) bool {
	var de *deferredError
	return errors.As(err, &de) && de.refused
}

// completeFailed reports a complete with deferred statements whose
// transaction did not commit, after marking the record failed (fenced, best
// effort) so a retry may run the handler again at once: the writes went
// with the transaction. A deferred statement the server refused means
// nothing committed: storekit.ErrNotCommitted. Anything else (a connection
// lost, a COMMIT without an answer) may have committed: a plain error (if
// the commit did land, the record is completed and the fenced fail matches
// nothing).
func (s *Store) completeFailed(ctx context.Context, f storekit.Fence, err error) error {
	s.releaseAfterTxFailure(ctx, f)
	if isRefused(err) {
		return fmt.Errorf("%w: %w", storekit.ErrNotCommitted, wrap(ctx, "complete (deferred statements)", err))
	}
	return wrap(ctx, "complete (in transaction)", err)
}
