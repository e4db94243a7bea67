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

// fenced runs a fenced write in a write transaction (shared with the
// writes queued beside it: writer.go) and reports whether it matched.
func (s *Store) fenced(ctx context.Context, query string, args ...any) (matched bool, err error) {
	err = s.wr.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		st, err := s.inTx(ctx, tx, query)
		if err != nil {
			return err
		}
		res, err := st.ExecContext(ctx, args...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		matched = n > 0
		return err
	})
	return matched, err
}

// Heartbeat implements core.Store: one UPDATE. While the lease's
// transaction (Tx) is open it holds SQLite's only write lock, and an
// UPDATE on another connection would wait for it to end: the heartbeat
// then runs inside that transaction. No other writer can take the record
// over meanwhile, and if the process dies the transaction rolls back with
// the old locked_until, which is the right answer for a dead owner.
func (s *Store) Heartbeat(ctx context.Context, f storekit.Fence, extend time.Duration) error {
	const op = "heartbeat"
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	if extend < time.Microsecond {
		return fmt.Errorf("sqlitestore: heartbeat: extension %v must be at least 1µs", extend)
	}
	args := []any{micros(extend), b(f.Scope), b(f.Key), f.Token}
	ok, inTx, err := s.heartbeatInTx(ctx, f, args)
	if !inTx {
		ok, err = s.fenced(ctx, s.sql.heartbeat, args...)
	}
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !ok {
		return fmt.Errorf("sqlitestore: heartbeat: %w", core.ErrLeaseLost)
	}
	return nil
}

func completeArgs(f storekit.Fence, resp storekit.StoredResponse) []any {
	header, body := sqlkit.ResponseBlobs(resp)
	return []any{int32(resp.Status), header, body, resp.NotRetained, b(f.Scope), b(f.Key), f.Token}
}

// Complete implements core.Store: one fenced UPDATE. When ctx carries the
// lease for f and Tx began a transaction for it, the UPDATE runs inside
// that transaction, which is then committed: the handler's writes and the
// stored response are one atomic fact (see Tx). Statements queued by Defer
// run in that transaction after it, or, without one, in a write
// transaction Complete begins for them and the UPDATE.
func (s *Store) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	const op = "complete"
	if err := ctx.Err(); err != nil {
		s.abandonTx(ctx, f)
		return wrap(ctx, op, err)
	}
	if resp.Status < 100 || resp.Status > 999 {
		s.abandonTx(ctx, f)
		return fmt.Errorf("sqlitestore: complete: invalid response status %d", resp.Status)
	}
	defer s.watch.notify(f.Scope, f.Key)
	args := completeArgs(f, resp)
	tx, marked, deferred := s.takeTx(ctx, f)
	if tx != nil {
		return s.completeInTx(ctx, tx, marked, f, deferred, args)
	}
	if len(deferred) > 0 {
		return s.completeDeferred(ctx, f, deferred, args, false)
	}
	ok, err := s.fenced(ctx, s.sql.complete, args...)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !ok {
		return fmt.Errorf("sqlitestore: complete: %w", core.ErrLeaseLost)
	}
	return nil
}

// Fail implements core.Store: one fenced UPDATE. A transaction begun by Tx
// for this lease is rolled back first, and statements queued by Defer are
// dropped; if the handler had committed it itself, the record is completed
// as not retained instead (see Tx).
func (s *Store) Fail(ctx context.Context, f storekit.Fence) error {
	const op = "fail"
	defer s.watch.notify(f.Scope, f.Key)
	if s.abandonTx(ctx, f) {
		committed, err := s.failAfterHandlerCommitted(ctx, f)
		switch {
		case errors.Is(err, core.ErrLeaseLost):
			return fmt.Errorf("sqlitestore: fail: %w", err)
		case err != nil:
			return wrap(ctx, "fail: the handler ended the transaction: read its commit mark, or complete the record as not retained", err)
		case committed:
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	ok, err := s.fenced(ctx, s.sql.fail, b(f.Scope), b(f.Key), f.Token)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !ok {
		return fmt.Errorf("sqlitestore: fail: %w", core.ErrLeaseLost)
	}
	return nil
}

// Get implements core.Store: one SELECT. An expired record is returned as
// stored.
func (s *Store) Get(ctx context.Context, scope, key string) (storekit.Record, error) {
	const op = "get"
	if err := ctx.Err(); err != nil {
		return storekit.Record{}, wrap(ctx, op, err)
	}
	st, err := s.stmt(ctx, s.sql.get)
	if err != nil {
		return storekit.Record{}, wrap(ctx, op, err)
	}
	var now int64
	r, err := scanRecord(st.QueryRowContext(ctx, b(scope), b(key)), &now)
	if errors.Is(err, sql.ErrNoRows) {
		return storekit.Record{}, fmt.Errorf("sqlitestore: get: %w", storekit.ErrNotFound)
	}
	if err != nil {
		return storekit.Record{}, wrap(ctx, op, err)
	}
	r.Scope, r.Key = scope, key
	return r, nil
}
