package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestLedgerStore() (ledgerStore, *memLedger, *fakeClock) {
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ml := newMemLedger()
	return ledgerStore{Store: memstore.New(memstore.WithClock(clock.Now)), ledger: ml,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}, ml, clock
}

func claim(t *testing.T, s core.Store, key string) (context.Context, storekit.Fence) {
	t.Helper()
	res, err := s.Claim(context.Background(), storekit.ClaimRequest{
		Scope: "u1", Key: key, Method: "POST", Route: "/v1/payments", Fingerprint: "fp",
		Lease: time.Second, Retention: time.Hour,
	})
	if err != nil || !res.Claimed {
		t.Fatalf("claim %s: %+v %v", key, res, err)
	}
	f := storekit.Fence{Scope: "u1", Key: key, Token: res.Record.Token}
	return storetest.ContextWithLease(context.Background(), storetest.NewLease(s, f)), f
}

func TestMemLedgerBooksOnlyCommittedRows(t *testing.T) {
	s, ml, clock := newTestLedgerStore()
	ctx := context.Background()

	// Committed: the row appears, and only then.
	lctx, f := claim(t, s, "k-ok")
	if err := ml.Record(lctx, "u1", Payment{ID: "pay_ok", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	if ps, _ := ml.List(ctx, "u1"); len(ps) != 0 {
		t.Fatalf("row visible before the commit: %+v", ps)
	}
	if err := s.Complete(lctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if ps, _ := ml.List(ctx, "u1"); len(ps) != 1 || ps[0].ID != "pay_ok" {
		t.Fatalf("after commit: %+v, want pay_ok", ps)
	}

	// Failed (5xx, panic): no row.
	lctx, f = claim(t, s, "k-fail")
	_ = ml.Record(lctx, "u1", Payment{ID: "pay_fail", Amount: 1})
	if err := s.Fail(lctx, f); err != nil {
		t.Fatal(err)
	}

	// Lease lost to a takeover: the stale owner's commit fails, no row;
	// the new owner's commit books its own.
	staleCtx, stale := claim(t, s, "k-zombie")
	_ = ml.Record(staleCtx, "u1", Payment{ID: "pay_zombie_stale", Amount: 1})
	clock.Add(2 * time.Second) // the stale owner's lease lapses
	newCtx, fresh := claim(t, s, "k-zombie")
	_ = ml.Record(newCtx, "u1", Payment{ID: "pay_zombie_new", Amount: 1})
	if err := s.Complete(staleCtx, stale, storekit.StoredResponse{Status: 201}); !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("stale commit: %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(newCtx, fresh, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}

	ps, _ := ml.List(ctx, "u1")
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.ID)
	}
	if len(ids) != 2 || ids[0] != "pay_ok" || ids[1] != "pay_zombie_new" {
		t.Errorf("ledger %q, want [pay_ok pay_zombie_new]", ids)
	}
	if ps, _ := ml.List(ctx, "u2"); len(ps) != 0 {
		t.Errorf("u2 sees %+v", ps)
	}
	if err := ml.Record(ctx, "u1", Payment{ID: "x"}); !errors.Is(err, errNoLease) {
		t.Errorf("Record without a lease: %v, want errNoLease", err)
	}
}

// The store wrapper must keep memstore's optional capabilities.
func TestLedgerStoreKeepsWatcher(t *testing.T) {
	s, _, _ := newTestLedgerStore()
	var cs core.Store = s
	if _, ok := cs.(storekit.Watcher); !ok {
		t.Error("ledgerStore hides memstore's storekit.Watcher; wait mode would fall back to polling")
	}
}
