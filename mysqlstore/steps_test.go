package mysqlstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// TestFreshAndSteps: Fresh is set for a created record (new key, new again)
// and not for a takeover; saving the same result twice is not a lost lease;
// one round trip each (warm).
func TestFreshAndSteps(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	req := claimReq("fresh", 50*time.Millisecond)
	req.Retention = 150 * time.Millisecond
	res, err := s.Claim(ctx, req)
	if err != nil || !res.Claimed || !res.Fresh {
		t.Fatalf("new key: claimed %v fresh %v err %v, want both", res.Claimed, res.Fresh, err)
	}
	f := core.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	for range 2 { // the same result twice: the second UPDATE changes nothing
		if err := s.SaveStep(ctx, f, "charge", []byte("ch_1")); err != nil {
			t.Fatalf("save: %v", err)
		}
	}
	time.Sleep(80 * time.Millisecond) // lease lapses, retention not yet
	res, err = s.Claim(ctx, req)
	if err != nil || !res.Claimed || res.Fresh {
		t.Fatalf("takeover: claimed %v fresh %v err %v, want claimed and not fresh", res.Claimed, res.Fresh, err)
	}
	g := core.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	steps, err := s.LoadSteps(ctx, g)
	if err != nil || string(steps["charge"]) != "ch_1" {
		t.Fatalf("steps after takeover: %q %v", steps, err)
	}
	if err := s.SaveStep(ctx, f, "charge", []byte("ch_1")); err == nil {
		t.Error("the stale owner saved a step (identical result) after the takeover")
	}
	time.Sleep(200 * time.Millisecond) // past retention and lease: new again
	res, err = s.Claim(ctx, req)
	if err != nil || !res.Claimed || !res.Fresh {
		t.Fatalf("new again: claimed %v fresh %v err %v, want both", res.Claimed, res.Fresh, err)
	}
}
