package mysqlstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestSweep: expired records past the margin go, in batches; live ones,
// and expired ones held by a live lease, stay; old token draws go too.
func TestSweep(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db, WithRetentionMargin(0))
	ctx := t.Context()
	short := func(key string, lease time.Duration) storekit.ClaimResult {
		req := claimReq(key, lease)
		req.Retention = 50 * time.Millisecond
		res, err := s.Claim(ctx, req)
		if err != nil || !res.Claimed {
			t.Fatalf("claim %s: %v", key, err)
		}
		return res
	}
	for i := range 25 {
		res := short("old-"+string(rune('a'+i)), time.Minute)
		if err := s.Complete(ctx, storekit.Fence{Scope: "tenant", Key: res.Record.Key, Token: res.Record.Token}, storekit.StoredResponse{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	short("held", time.Minute) // processing, lease live past retention
	if _, err := s.Claim(ctx, claimReq("live", time.Minute)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n, err := s.Sweep(ctx, 10); err != nil || n != 10 {
		t.Fatalf("first batch: %d, %v; want 10", n, err)
	}
	if err := s.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := db.QueryRow("SELECT COUNT(*) FROM idem_records").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 2 {
		t.Errorf("%d records left, want 2 (held, live)", left)
	}
	var toks int
	if err := db.QueryRow("SELECT COUNT(*) FROM idem_records_tokens").Scan(&toks); err != nil {
		t.Fatal(err)
	}
	if toks != 1 {
		t.Errorf("%d token rows left, want 1 (the newest)", toks)
	}
	// Tokens keep increasing after the draws were deleted.
	before, _ := s.Get(ctx, "tenant", "live")
	res, err := s.Claim(ctx, claimReq("after-sweep", time.Minute))
	if err != nil || res.Record.Token <= before.Token {
		t.Errorf("token after sweep %d, want > %d (%v)", res.Record.Token, before.Token, err)
	}
	if _, err := s.Sweep(ctx, 0); err == nil {
		t.Error("Sweep(0) accepted")
	}
}

// TestSweepMargin: Sweep keeps a record expired less than the retention
// margin ago (DefaultRetentionMargin when unset) and deletes it once the
// margin has passed. Stores whose clock runs ahead (tests only) see the
// record expired 50 and 70 minutes ago.
func TestSweepMargin(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
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
