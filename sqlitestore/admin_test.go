package sqlitestore

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// TestAdmin: the operator's view (cmd/idemctl) of a completed and a stuck
// record, a refused and an accepted Release, and the census.
func TestAdmin(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	if st, err := s.Stats(ctx); err != nil || len(st.ByStatus) != 0 || st.Now.IsZero() {
		t.Fatalf("stats of an empty store: %+v, %v", st, err)
	}
	done, err := s.Claim(ctx, claimReq("done", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, storekit.Fence{Scope: "tenant", Key: "done", Token: done.Record.Token}, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	ar, err := s.Inspect(ctx, "tenant", "done")
	if err != nil || ar.Status != storekit.StatusCompleted || ar.CompletedAt.IsZero() || ar.Response == nil || string(ar.Response.Body) != "ok" {
		t.Fatalf("inspect: %+v, %v", ar, err)
	}
	if _, err := s.Inspect(ctx, "tenant", "missing"); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("inspect of a missing key: %v", err)
	}

	live, err := s.Claim(ctx, claimReq("live", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lf := storekit.Fence{Scope: "tenant", Key: "live", Token: live.Record.Token}
	if err := s.Release(ctx, lf, false); !errors.Is(err, storekit.ErrLeaseLive) {
		t.Fatalf("release of a live lease: %v, want ErrLeaseLive", err)
	}
	stuck, err := s.Claim(ctx, claimReq("stuck", 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var list []storekit.AdminRecord
	for len(list) == 0 {
		if list, err = s.Stuck(ctx, 10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // poll until the 20ms lease lapses
	}
	if len(list) != 1 || list[0].Key != "stuck" || !list[0].Stuck() {
		t.Fatalf("stuck: %+v", list)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[storekit.Status]storekit.StatusCount{}
	for _, c := range st.ByStatus {
		counts[c.Status] = c
	}
	if counts[storekit.StatusCompleted].Count != 1 || counts[storekit.StatusProcessing].Count != 2 || counts[storekit.StatusProcessing].Stuck != 1 ||
		counts[storekit.StatusProcessing].UnderMinute != 2 {
		t.Fatalf("stats: %+v", st.ByStatus)
	}
	if err := s.Release(ctx, storekit.Fence{Scope: "tenant", Key: "stuck", Token: stuck.Record.Token}, false); err != nil {
		t.Fatalf("release of a stuck record: %v", err)
	}
	if r, err := s.Get(ctx, "tenant", "stuck"); err != nil || r.Status != storekit.StatusFailed {
		t.Fatalf("after release: %v %v", r.Status, err)
	}
	if err := s.Release(ctx, lf, true); err != nil {
		t.Fatalf("release of a live lease, forced: %v", err)
	}
}

// TestSweep: an expired record goes (with its steps), a live one stays.
func TestSweep(t *testing.T) {
	s := newStore(t, WithRetentionMargin(0))
	ctx := t.Context()
	// The lease outlives the SaveStep below on a loaded machine (a 5 ms
	// lease lapsed before it in a make test run: "lease lost"); the loop
	// then polls until retention has passed.
	req := claimReq("old", 500*time.Millisecond)
	req.Retention = 500 * time.Millisecond
	old, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f := storekit.Fence{Scope: "tenant", Key: "old", Token: old.Record.Token}
	if err := s.SaveStep(ctx, f, "charge", []byte("ch_1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, claimReq("new", time.Minute)); err != nil {
		t.Fatal(err)
	}
	var n int
	for n == 0 {
		if n, err = s.Sweep(ctx, 100); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // poll until retention passes
	}
	if n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	if _, err := s.Get(ctx, "tenant", "old"); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("swept record: %v", err)
	}
	var steps int
	if err := s.db.QueryRow("SELECT COUNT(*) FROM " + s.names.steps).Scan(&steps); err != nil || steps != 0 {
		t.Fatalf("%d steps left (%v), want 0", steps, err)
	}
	if _, err := s.Get(ctx, "tenant", "new"); err != nil {
		t.Fatalf("live record: %v", err)
	}
	if err := s.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSweepMargin: Sweep keeps a record expired less than the retention
// margin ago (DefaultRetentionMargin when unset) and deletes it once the
// margin has passed. Stores whose clock runs ahead (tests only) see the
// record expired 50 and 70 minutes ago.
func TestSweepMargin(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	req := claimReq("k", time.Minute)
	req.Retention = time.Minute
	res, err := s.Claim(t.Context(), req)
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if err := s.Complete(t.Context(), storekit.Fence{Scope: "tenant", Key: "k", Token: res.Record.Token}, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ahead time.Duration
		want  int
	}{
		{req.Retention + DefaultRetentionMargin - 10*time.Minute, 0},
		{req.Retention + DefaultRetentionMargin + 10*time.Minute, 1},
	} {
		later := openStore(t, db, withClockOffset(c.ahead))
		if n, err := later.Sweep(t.Context(), 10); err != nil || n != c.want {
			t.Fatalf("Sweep %v after the claim: %d, %v; want %d", c.ahead, n, err, c.want)
		}
	}
}
