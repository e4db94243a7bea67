package memstore

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// LoadSteps implements storekit.StepStore: the steps stored for the record f
// owns. The map and its slices are the caller's.
func (s *Store) LoadSteps(ctx context.Context, f storekit.Fence) (map[string][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memstore: load steps: %w", err)
	}
	r, ok := s.ownedLocked(f, s.now())
	if !ok {
		return nil, fmt.Errorf("memstore: load steps: %w", core.ErrLeaseLost)
	}
	out := make(map[string][]byte, len(r.steps))
	for name, v := range r.steps {
		out[name] = append([]byte{}, v...)
	}
	return out, nil
}

// SaveStep implements storekit.StepStore. Steps live on the record: they are
// kept when it fails or is taken over, dropped when it completes, and gone
// with it when it expires (a key new again starts with none).
func (s *Store) SaveStep(ctx context.Context, f storekit.Fence, name string, result []byte) error {
	kept := append([]byte{}, result...) // copied before the lock, as Complete does
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: save step: %w", err)
	}
	r, ok := s.ownedLocked(f, s.now())
	if !ok {
		return fmt.Errorf("memstore: save step: %w", core.ErrLeaseLost)
	}
	if r.steps == nil {
		r.steps = make(map[string][]byte)
	}
	r.steps[name] = kept
	return nil
}
