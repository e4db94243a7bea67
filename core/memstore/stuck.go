package memstore

import (
	"context"
	"fmt"
	"slices"

	"github.com/idemkit/idem/core/storekit"
)

// Stuck lists up to limit processing records whose lease lapsed, the
// longest lapsed first, without their responses: storekit.Admin's Stuck,
// which core/completer needs to find stalled executions.
func (s *Store) Stuck(ctx context.Context, limit int) ([]storekit.AdminRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memstore: stuck: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []storekit.AdminRecord
	for _, r := range s.recs {
		if r.Status == storekit.StatusProcessing && !now.Before(r.LockedUntil) && !expired(r, now) {
			out = append(out, storekit.AdminRecord{Record: r.Record, Now: now})
		}
	}
	slices.SortFunc(out, func(a, b storekit.AdminRecord) int { return a.LockedUntil.Compare(b.LockedUntil) })
	if len(out) > limit {
		out = out[:max(limit, 0)]
	}
	return out, nil
}
