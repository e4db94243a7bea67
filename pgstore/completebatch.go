package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

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
		if !s.writes.do(ctx, p) {
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

func (p *pendingComplete) queue(s *Store, b *pgx.Batch) {
	queueDeferred(b, p.deferred)
	b.Queue(s.sql.completeTx, p.args...)
}

func (p *pendingComplete) read(br pgx.BatchResults) error {
	if err := readDeferred(br, len(p.deferred)); err != nil {
		return err
	}
	return br.QueryRow().Scan(&p.waiters)
}

func (p *pendingComplete) runAlone(s *Store) {
	p.waiters, p.err = s.completeAlone(p.ctx, p.f, p.deferred, p.args)
}
