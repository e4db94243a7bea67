package mysqlstore

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

func TestAdmin(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	claim := func(key string, lease time.Duration) storekit.Fence {
		t.Helper()
		res, err := s.Claim(ctx, claimReq(key, lease))
		if err != nil || !res.Claimed {
			t.Fatalf("claim %s: %v", key, err)
		}
		return storekit.Fence{Scope: "tenant", Key: key, Token: res.Record.Token}
	}
	done := claim("done", time.Minute)
	if err := s.Complete(ctx, done, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	live := claim("live", time.Minute)
	stuck1 := claim("stuck-1", 10*time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	stuck2 := claim("stuck-2", 10*time.Millisecond)
	time.Sleep(30 * time.Millisecond)

	ar, err := s.Inspect(ctx, "tenant", "done")
	if err != nil || ar.Status != storekit.StatusCompleted || ar.Response == nil || string(ar.Response.Body) != "ok" ||
		ar.CompletedAt.IsZero() || ar.Now.Before(ar.CompletedAt) {
		t.Fatalf("inspect done: %+v %v", ar, err)
	}
	if _, err := s.Inspect(ctx, "tenant", "nope"); !errors.Is(err, storekit.ErrNotFound) {
		t.Errorf("inspect missing: %v", err)
	}
	list, err := s.Stuck(ctx, 10)
	if err != nil || len(list) != 2 || list[0].Key != "stuck-1" || list[1].Key != "stuck-2" || !list[0].Stuck() {
		t.Fatalf("stuck: %+v %v", list, err)
	}
	if err := s.Release(ctx, live, false); !errors.Is(err, storekit.ErrLeaseLive) {
		t.Errorf("release live without force: %v", err)
	}
	if err := s.Release(ctx, stuck1, false); err != nil {
		t.Errorf("release stuck: %v", err)
	}
	if err := s.Release(ctx, stuck1, false); !errors.Is(err, core.ErrLeaseLost) {
		t.Errorf("release twice: %v", err)
	}
	if err := s.Complete(ctx, stuck1, storekit.StoredResponse{Status: 200}); !errors.Is(err, core.ErrLeaseLost) {
		t.Errorf("the released owner's late Complete: %v", err)
	}
	if err := s.Release(ctx, live, true); err != nil {
		t.Errorf("release live with force: %v", err)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[storekit.Status]storekit.StatusCount{}
	for _, c := range st.ByStatus {
		got[c.Status] = c
	}
	if got[storekit.StatusCompleted].Count != 1 || got[storekit.StatusFailed].Count != 2 || got[storekit.StatusProcessing].Count != 1 ||
		got[storekit.StatusProcessing].Stuck != 1 || got[storekit.StatusFailed].UnderMinute != 2 || got[storekit.StatusCompleted].Oldest.IsZero() {
		t.Errorf("stats: %+v", st)
	}
	_ = stuck2
}
