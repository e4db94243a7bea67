package otelidem_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/completer"
	"github.com/idemkit/idem/core/storetest"
)

// TestCompleterIsCounted: a completer's takeover of a stalled execution
// is a decision of its own (idem.outcome=stalled), then an ordinary
// commit; otelidem's store decorator lets the completer find what it needs.
func TestCompleterIsCounted(t *testing.T) {
	r := newRig(t)
	run := func(ctx context.Context) ([]byte, error) {
		return core.Step(ctx, "charge", func(context.Context) ([]byte, error) { return []byte("ch"), nil })
	}
	call := core.CallRequest{Scope: "s", Key: "k-" + sentinel, Name: "pay", Input: []byte("1")}
	dying := storetest.NewDying(r.store)
	dead, err := core.New(dying, core.WithLease(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	register := completer.Call("pay", func(ctx context.Context, _ []byte) ([]byte, error) { return run(ctx) })
	if _, err := completer.New(dead, register); err != nil {
		t.Fatal(err)
	}
	if _, err := dead.Call(t.Context(), call, func(ctx context.Context) ([]byte, error) {
		if _, err := run(ctx); err != nil {
			return nil, err
		}
		dying.Kill()
		return nil, storetest.ErrKilled
	}); err == nil {
		t.Fatal("the dying call succeeded")
	}
	c, err := completer.New(r.engine(t), register, completer.WithAfter(0)) // the default lease: none lapses under load
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := c.Once(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if rep.Finished == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not finished: %+v", rep)
		}
		time.Sleep(20 * time.Millisecond) // polls until the dead owner's lease lapsed
	}
	points := r.collect(t)
	if n := sum(points, "idem.decisions", outcome("stalled")); n != 1 {
		t.Errorf("idem.decisions{stalled} = %d, want 1", n)
	}
	if n := sum(points, "idem.commits", outcome("commit")); n != 1 {
		t.Errorf("idem.commits{commit} = %d, want 1", n)
	}
	checkNoSentinel(t, points, r.spans.Ended(), false)
}
