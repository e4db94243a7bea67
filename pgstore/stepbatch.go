package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
)

// pendingStep is one SaveStep and, once answered, its answer.
type pendingStep struct {
	pendingBase
	f       storekit.Fence
	name    string
	result  []byte
	matched bool
}

// saveStep runs one step's statement: matched is false when its fence
// matched nothing.
func (s *Store) saveStep(ctx context.Context, f storekit.Fence, name string, result []byte) (matched bool, err error) {
	if s.cfg.batching {
		p := &pendingStep{pendingBase: pendingBase{scope: f.Scope, key: f.Key}, f: f, name: name, result: result}
		s.writes.do(ctx, p)
		return p.matched, p.err
	}
	return s.saveStepAlone(ctx, f, name, result)
}

func (s *Store) saveStepAlone(ctx context.Context, f storekit.Fence, name string, result []byte) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.steps.save, f.Scope, f.Key, f.Token, name, result)
	return err == nil && tag.RowsAffected() > 0, err
}

func (p *pendingStep) queue(s *Store, b *pgx.Batch) {
	b.Queue(s.steps.save, p.f.Scope, p.f.Key, p.f.Token, p.name, p.result)
}

func (p *pendingStep) read(br pgx.BatchResults) error {
	tag, err := br.Exec()
	p.matched = err == nil && tag.RowsAffected() > 0
	return err
}

func (p *pendingStep) runAlone(s *Store) {
	p.matched, p.err = s.saveStepAlone(p.ctx, p.f, p.name, p.result)
}
