package pgstore

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

var _ storekit.ClaimSyncer = (*Store)(nil)

// SyncClaim implements storekit.ClaimSyncer. In transactional mode a claim
// commits without waiting for its WAL flush; a crash before the business
// commit loses it, which loses a lock, never a fact — until a relay key
// derived from the record has left the process: a retry after the crash
// would create another record, relay another key and be charged again.
// core.RelayKey calls SyncClaim before the first key of an execution
// leaves: one fenced statement that waits for its flush, and so for the
// claim's. In plain mode claims are synchronous and it does nothing,
// unless the pool's sessions run with synchronous_commit = off (as read at
// the store's first claim): their claims are asynchronous too.
func (s *Store) SyncClaim(ctx context.Context, f storekit.Fence) error {
	const op = "sync claim"
	if !s.cfg.transactional && !s.asyncSessions.Load() {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	tag, err := s.pool.Exec(ctx, s.sql.syncClaim, f.Scope, f.Key, f.Token)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: sync claim: %w", core.ErrLeaseLost)
	}
	return nil
}
