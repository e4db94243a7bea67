package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// deferredStmt is one statement queued by Defer.
type deferredStmt struct {
	sql  string
	args []any
}

// Defer queues a write of the current idem execution to run when idem
// stores its response: in the same transaction as the stored response, in
// the same round trip (pipelined ahead of the fenced complete). It is for
// business writes whose result the handler does not need before it
// answers: a ledger row, an outbox message, a counter. A first execution
// that writes only through Defer costs two database round trips (the claim
// and the complete) instead of three with Tx (the claim, the handler's
// statements, the complete).
//
// ctx is the handler's context, as for Tx, which returns the same errors
// (ErrNoLease, ErrLeaseFinished). What happens to a queued statement:
//
//   - It runs only if the engine completes the key with the handler's
//     response (a final status). When the key is released instead (a
//     retryable status, a handler error or panic, a client that went away),
//     it never runs.
//   - Statements run in the order they were queued, after everything the
//     handler ran through Tx, in Tx's transaction if the handler began one.
//   - If one fails (a constraint, an error it raises) the whole transaction
//     rolls back: the other queued statements, the writes made through Tx
//     and the response are not stored. The key is released (a retry runs
//     the handler again) and the engine answers 500 instead of the
//     handler's response; the error wraps storekit.ErrNotCommitted and is
//     logged by the engine.
//   - If the lease was lost meanwhile, it rolls back with the rest (the
//     complete fails with core.ErrLeaseLost).
//
// args are encoded when the statement is sent, not when it is queued: do
// not modify a slice or map passed as an argument after queueing it. Query
// options (pgx.QueryExecMode, pgx.QueryResultFormats...) are refused: the
// statement travels in a batch, which takes none; pgx.QueryRewriter is
// accepted.
func Defer(ctx context.Context, sql string, args ...any) error {
	lease, ok := storekit.LeaseFromContext(ctx)
	if !ok {
		return ErrNoLease
	}
	if storeOf(lease) == nil {
		return fmt.Errorf("pgstore: defer: the lease was granted by %T, not by a *pgstore.Store (or a store whose Unwrap returns one)", lease.Store())
	}
	if !pipelinable(args) {
		return errors.New("pgstore: defer: query options (pgx.QueryExecMode, pgx.QueryResultFormats) cannot be used with a deferred statement")
	}
	st := attachState(lease)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return ErrLeaseFinished
	}
	st.deferred = append(st.deferred, deferredStmt{sql: sql, args: args})
	return nil
}

// queueDeferred adds the deferred statements to b.
func queueDeferred(b *pgx.Batch, deferred []deferredStmt) {
	for _, d := range deferred {
		b.Queue(d.sql, d.args...)
	}
}

// readDeferred reads the results of the n deferred statements queued first
// in a batch, up to the first that failed.
func readDeferred(br pgx.BatchResults, n int) error {
	for range n {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

// sendDeferred sends the deferred statements and the fenced complete in
// one pipeline on a pool connection, and reads their results: statements
// pipelined up to one Sync run in one implicit transaction, so they commit
// together, or not at all (completeTx raises when the fence matches
// nothing). No BEGIN or COMMIT is needed.
func (s *Store) sendDeferred(ctx context.Context, deferred []deferredStmt, args []any) (waiters bool, err error) {
	b := &pgx.Batch{}
	queueDeferred(b, deferred)
	b.Queue(s.sql.completeTx, args...)
	br := s.pool.SendBatch(ctx, b)
	err = readDeferred(br, len(deferred))
	if err == nil {
		err = br.QueryRow().Scan(&waiters)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return waiters, err
}

// completeFailed reports a complete whose transaction did not commit: a lost
// lease, or anything else, after which the key is marked failed if it is
// still ours (it is not if a commit whose answer was lost did land). With
// deferred statements, one PostgreSQL refused is reported as
// storekit.ErrNotCommitted: the writes certainly rolled back.
func (s *Store) completeFailed(ctx context.Context, f storekit.Fence, err error, deferred bool) error {
	if isLeaseLost(err) {
		return fmt.Errorf("pgstore: complete: %w (handler transaction rolled back)", core.ErrLeaseLost)
	}
	s.releaseAfterTxFailure(ctx, f)
	if deferred && statementRefused(err) {
		return fmt.Errorf("%w: %w", storekit.ErrNotCommitted, wrap(ctx, "complete (deferred statements)", err))
	}
	return wrap(ctx, "complete (in transaction)", err)
}

// statementRefused reports whether err is PostgreSQL refusing a statement
// (severity ERROR), which aborts the transaction: nothing of it committed.
// A FATAL (the backend terminated, possibly after the commit, before its
// answer) or a lost connection leaves the outcome unknown.
func statementRefused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	sev := pgErr.SeverityUnlocalized
	if sev == "" {
		sev = pgErr.Severity
	}
	return sev == "ERROR"
}
