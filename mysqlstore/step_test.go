package mysqlstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestFreshAndSteps: Fresh is set for a created record (new key, new again)
// and not for a takeover; saving the same result twice is not a lost lease;
// one round trip each (warm).
func TestFreshAndSteps(t *testing.T) {
	// Stores whose clocks run ahead stand in for waiting (no sleeps: a
	// loaded machine cannot push the takeover past retention).
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	later := openStore(t, db, withClockOffset(2*time.Minute)) // lease lapsed, retention not
	muchLater := openStore(t, db, withClockOffset(3*time.Hour))
	ctx := t.Context()
	req := claimReq("fresh", time.Minute) // retention 1h
	res, err := s.Claim(ctx, req)
	if err != nil || !res.Claimed || !res.Fresh {
		t.Fatalf("new key: claimed %v fresh %v err %v, want both", res.Claimed, res.Fresh, err)
	}
	f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	for range 2 { // the same result twice: the second UPDATE changes nothing
		if err := s.SaveStep(ctx, f, "charge", []byte("ch_1")); err != nil {
			t.Fatalf("save: %v", err)
		}
	}
	res, err = later.Claim(ctx, req)
	if err != nil || !res.Claimed || res.Fresh {
		t.Fatalf("takeover: claimed %v fresh %v err %v, want claimed and not fresh", res.Claimed, res.Fresh, err)
	}
	g := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	steps, err := later.LoadSteps(ctx, g)
	if err != nil || string(steps["charge"]) != "ch_1" {
		t.Fatalf("steps after takeover: %q %v", steps, err)
	}
	if err := s.SaveStep(ctx, f, "charge", []byte("ch_1")); err == nil {
		t.Error("the stale owner saved a step (identical result) after the takeover")
	}
	res, err = muchLater.Claim(ctx, req)
	if err != nil || !res.Claimed || !res.Fresh {
		t.Fatalf("new again: claimed %v fresh %v err %v, want both", res.Claimed, res.Fresh, err)
	}
	if steps, err := muchLater.LoadSteps(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}); err != nil || len(steps) != 0 {
		t.Errorf("steps of a key new again: %q %v, want none", steps, err)
	}
}
