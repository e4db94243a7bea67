package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// completeBatch (unless WithoutBatching) gathers the completes of concurrent
// requests that have no Tx into one pipeline, and so into one implicit
// transaction: each request's deferred statements, then its fenced
// complete (completeTx, which raises when its fence matches nothing), one
// request after the other in (scope, key) order. On a CPU-bound database
// a transaction's cost is mostly per round trip and per commit, not per
// statement (BENCHMARKS.md §3, scripts/pgfloor.sh), so n completes in one transaction
// cost far less than n.
//
// A request's writes and its response still commit together or not at
// all; the requests of one batch commit together, or roll back together.
// A batch that fails, however, is sent again request by request, so one
// request's error (a constraint, a lost lease) is never another's. That is
// safe even when the failure hid a commit (the connection died after it):
// each request's deferred statements travel with its fenced complete,
// which then matches nothing (the record is completed) and rolls them back,
// so nothing runs twice; that request is answered ErrLeaseLost, and a retry
// replays the stored response.
type completeBatch = batcher[*pendingComplete]

// pendingComplete is one complete and, once answered, its answer.
type pendingComplete struct {
	pendingBase
	f        storekit.Fence
	deferred []deferredStmt
	args     []any
	waiters  bool
}

// completeOutside completes f without a Tx: alone, or batched with
// concurrent completes when the store batches them.
func (s *Store) completeOutside(ctx context.Context, f storekit.Fence, deferred []deferredStmt, args []any) error {
	var (
		waiters bool
		err     error
	)
	if s.cfg.batching {
		p := &pendingComplete{pendingBase: pendingBase{scope: f.Scope, key: f.Key}, f: f, deferred: deferred, args: args}
		if !s.completes.do(ctx, p) {
			// Withdrawn before it was sent: as a complete whose
			// context ended before it began.
			return wrap(ctx, "complete", p.err)
		}
		waiters, err = p.waiters, p.err
	} else {
		waiters, err = s.completeAlone(ctx, f, deferred, args)
	}
	if err != nil {
		return err
	}
	if waiters {
		s.notify(ctx, f.Scope, f.Key)
	}
	return nil
}

// completeAlone is one request's complete without a Tx: its deferred
// statements and the fenced complete in one pipeline (sendDeferred),
// or the fenced complete alone.
func (s *Store) completeAlone(ctx context.Context, f storekit.Fence, deferred []deferredStmt, args []any) (waiters bool, err error) {
	if len(deferred) > 0 {
		if waiters, err = s.sendDeferred(ctx, deferred, args); err != nil {
			return false, s.completeFailed(ctx, f, err, true)
		}
		return waiters, nil
	}
	matched, waiters, err := fenced(ctx, s.pool, s.sql.complete, args...)
	if err != nil {
		return false, wrap(ctx, "complete", err)
	}
	if !matched {
		return false, fmt.Errorf("pgstore: complete: %w", core.ErrLeaseLost)
	}
	return waiters, nil
}

// completeBatch sends batch's completes in one pipeline (see completeBatch
// the type) and sets each one's waiters. Its error sends each again alone.
func (s *Store) completeBatch(batch []*pendingComplete) error {
	ctx, cancel := batchContext(batch)
	defer cancel()
	b := &pgx.Batch{}
	for _, p := range batch {
		queueDeferred(b, p.deferred)
		b.Queue(s.sql.completeTx, p.args...)
	}
	br := s.pool.SendBatch(ctx, b)
	var err error
	for _, p := range batch {
		if err = readDeferred(br, len(p.deferred)); err != nil {
			break
		}
		if err = br.QueryRow().Scan(&p.waiters); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}
