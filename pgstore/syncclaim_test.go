package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// SyncClaim is fenced like every write of an owner: a stale token (the
// record failed, or was taken over) gets ErrLeaseLost and changes nothing,
// so the engine cancels a handler that would relay a key for a record it
// no longer owns. TestWALFlushes shows that it flushes.
func TestSyncClaimFenced(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s := newStore(t, pool, append([]Option{WithTransactional()}, m.opts...)...)
			ctx := t.Context()
			req := claimReq("k", time.Minute)
			res, err := s.Claim(ctx, req)
			if err != nil || !res.Claimed {
				t.Fatalf("claim: %+v, %v", res, err)
			}
			f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
			if err := s.SyncClaim(ctx, f); err != nil {
				t.Fatalf("sync claim of the owner: %v", err)
			}
			stale := f
			stale.Token++
			if err := s.SyncClaim(ctx, stale); !errors.Is(err, core.ErrLeaseLost) {
				t.Errorf("sync claim with a stale token: %v, want ErrLeaseLost", err)
			}
			if err := s.Fail(ctx, f); err != nil {
				t.Fatal(err)
			}
			if err := s.SyncClaim(ctx, f); !errors.Is(err, core.ErrLeaseLost) {
				t.Errorf("sync claim after the record failed: %v, want ErrLeaseLost", err)
			}
			rec, err := s.Get(ctx, req.Scope, req.Key)
			if err != nil || rec.Status != storekit.StatusFailed || rec.Token != f.Token {
				t.Errorf("record after refused syncs: %+v, %v; want failed under token %d", rec, err, f.Token)
			}
		})
	}
}
