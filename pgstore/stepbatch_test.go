package pgstore

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// TestStepBatch: SaveSteps that queue behind one in flight (a SHARE lock
// on the steps table holds it) travel in one pipeline with a complete
// queued beside them, and each gets its own answer: saved and loadable,
// completed, or ErrLeaseLost for the one whose lease was taken over,
// without failing the others.
func TestStepBatch(t *testing.T) {
	t.Parallel()
	s, tr := tracedStore(t, 0, withBatchLimit(1))
	ctx := t.Context()

	keys := []string{"s3", "stale", "s1", "s2"}
	fences := make([]storekit.Fence, len(keys))
	for i, k := range keys {
		lease := time.Minute
		if k == "stale" {
			lease = 300 * time.Millisecond
		}
		req := claimReq(k, lease)
		_, fences[i] = mustClaim(t, s, req)
		if k == "stale" {
			waitLapsed(t, s, req, fences[i])
			if res, err := s.Claim(ctx, claimReq(k, time.Minute)); err != nil || !res.Claimed {
				t.Fatalf("takeover: %+v, %v", res, err)
			}
		}
	}
	_, warm := mustClaim(t, s, claimReq("warm", time.Minute))
	doneCtx, done := mustClaim(t, s, claimReq("done", time.Minute))

	lock := lockTable(t, s, stepsTable(s.cfg))
	tr.reset()
	b := &s.writes
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.SaveStep(ctx, warm, "charge", []byte("w")); err != nil {
			t.Errorf("warm-up step: %v", err)
		}
	})
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.running == 1 })
	errs := make([]error, len(keys))
	for i, k := range keys {
		wg.Go(func() { errs[i] = s.SaveStep(ctx, fences[i], "charge", []byte("r "+k)) })
	}
	var completed error
	wg.Go(func() { completed = s.Complete(doneCtx, done, storekit.StoredResponse{Status: 201}) })
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == len(keys)+1 })
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	sqls, _ := tr.snapshot()
	batches, marker, complete := 0, short(s.steps.save), short(s.sql.completeTx)
	for _, q := range sqls {
		if strings.HasPrefix(q, "batch: ") && strings.Count(q, marker) == len(keys) && strings.Count(q, complete) == 1 {
			batches++
		}
	}
	if batches != 1 {
		t.Errorf("%d pipelines carried the %d queued steps and the complete, want 1; statements: %q", batches, len(keys), sqls)
	}
	if completed != nil {
		t.Errorf("complete beside the steps: %v", completed)
	}
	if n := takeFailed(b); n != 0 {
		t.Errorf("%d batch statements failed, want 0", n)
	}
	for i, k := range keys {
		if k == "stale" {
			if !errors.Is(errs[i], core.ErrLeaseLost) {
				t.Errorf("stale owner's step: %v, want ErrLeaseLost", errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("step %s beside a stale one: %v", k, errs[i])
			continue
		}
		got, err := s.LoadSteps(ctx, fences[i])
		if err != nil || string(got["charge"]) != "r "+k {
			t.Errorf("steps of %s = %q, %v; want its own result", k, got, err)
		}
	}
}
