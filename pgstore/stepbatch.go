package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
)

// stepBatch (unless WithoutBatching) gathers the SaveSteps of concurrent requests
// into one pipeline, and so into one implicit transaction and one
// synchronous commit, as PostgreSQL gathers commits into one flush: each
// step is its own fenced statement, and a step whose fence matches nothing
// answers ErrLeaseLost without failing the others. A pipeline that fails
// is sent again step by step.
type stepBatch = batcher[*pendingStep]

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
		s.stepSaves.do(ctx, p)
		return p.matched, p.err
	}
	return s.saveStepAlone(ctx, f, name, result)
}

func (s *Store) saveStepAlone(ctx context.Context, f storekit.Fence, name string, result []byte) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.steps.save, f.Scope, f.Key, f.Token, name, result)
	return err == nil && tag.RowsAffected() > 0, err
}

// saveSteps sends batch's steps in one pipeline and sets each one's
// answer; its error sends each again alone.
func (s *Store) saveSteps(batch []*pendingStep) error {
	ctx, cancel := batchContext(batch)
	defer cancel()
	b := &pgx.Batch{}
	for _, p := range batch {
		b.Queue(s.steps.save, p.f.Scope, p.f.Key, p.f.Token, p.name, p.result)
	}
	br := s.pool.SendBatch(ctx, b)
	var err error
	for _, p := range batch {
		tag, e := br.Exec()
		if err = e; err != nil {
			break
		}
		p.matched = tag.RowsAffected() > 0
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}
