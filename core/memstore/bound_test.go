package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// TestDefaultBound: without WithMaxEntries a store (New or the zero value)
// holds at most DefaultMaxEntries records; the next new key is refused
// with ErrFull and nothing is evicted.
func TestDefaultBound(t *testing.T) {
	for name, s := range map[string]*memstore.Store{"New": memstore.New(), "zero value": new(memstore.Store)} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			for i := range memstore.DefaultMaxEntries {
				if _, err := s.Claim(ctx, req(fmt.Sprint("k", i))); err != nil {
					t.Fatalf("claim %d of %d: %v", i+1, memstore.DefaultMaxEntries, err)
				}
			}
			_, err := s.Claim(ctx, req("one-too-many"))
			if !errors.Is(err, memstore.ErrFull) {
				t.Fatalf("claim %d: %v, want ErrFull: the store grows without bound by default", memstore.DefaultMaxEntries+1, err)
			}
			if n := s.Len(); n != memstore.DefaultMaxEntries {
				t.Errorf("Len %d, want %d (nothing evicted, nothing added)", n, memstore.DefaultMaxEntries)
			}
		})
	}
}

// TestFullStoreNeverRunsTwice drives a full store (the default bound)
// through the engine: a new key is answered 503 store-unavailable without
// running the handler; keys already held keep their guarantees (a
// completed one replays, an in-flight one is 409, a failed one is taken
// over once); once records expire, a new key fits again.
func TestFullStoreNeverRunsTwice(t *testing.T) {
	clk := newFakeClock()
	s := memstore.New(memstore.WithClock(clk.Now))
	eng, err := core.New(s, core.WithSharedKeySpace(), core.WithRetention(time.Hour), core.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var runs atomic.Int64
	// serve runs the whole flow for one request and returns its status;
	// commit false leaves the owner in flight (returned).
	serve := func(key, body string, status int, commit bool) (int, *core.Decision) {
		t.Helper()
		d, err := eng.Decide(ctx, core.Request{Method: http.MethodPost, Route: "/pay", Target: "/pay",
			Header: http.Header{"Idempotency-Key": {key}}, Body: strings.NewReader(body)})
		switch d.Outcome {
		case core.Proceed:
			runs.Add(1)
			if !commit {
				return 0, d
			}
			if err := eng.Commit(ctx, d, adapterkit.Response{Status: status}); err != nil {
				t.Fatalf("commit %s: %v", key, err)
			}
			return status, nil
		case core.Reject:
			if d.Problem == problem.StoreUnavailable && !errors.Is(err, memstore.ErrFull) {
				t.Errorf("%s: 503 for %v, want ErrFull", key, err)
			}
		}
		return d.Response.Status, nil
	}

	// Three keys with a part to play, then filler up to the bound.
	if st, _ := serve("done", "a", http.StatusCreated, true); st != http.StatusCreated {
		t.Fatalf("done: %d", st)
	}
	if st, _ := serve("failed", "a", http.StatusServiceUnavailable, true); st != http.StatusServiceUnavailable {
		t.Fatalf("failed: %d", st) // retryable: the record is failed, kept for takeover
	}
	_, inflight := serve("inflight", "a", 0, false)
	if inflight == nil {
		t.Fatal("inflight: not claimed")
	}
	for i := range memstore.DefaultMaxEntries - 3 {
		r := req(fmt.Sprint("filler-", i))
		r.Scope = ""
		if _, err := s.Claim(ctx, r); err != nil {
			t.Fatalf("filler %d: %v", i, err)
		}
	}
	runs.Store(0)

	if st, _ := serve("new", "a", http.StatusCreated, true); st != http.StatusServiceUnavailable {
		t.Errorf("a new key on a full store: %d, want 503", st)
	}
	if st, _ := serve("done", "a", 0, true); st != http.StatusCreated {
		t.Errorf("the completed key: %d, want its 201 replayed", st)
	}
	if st, _ := serve("inflight", "a", 0, true); st != http.StatusConflict {
		t.Errorf("the in-flight key: %d, want 409", st)
	}
	if st, _ := serve("failed", "a", http.StatusCreated, true); st != http.StatusCreated {
		t.Errorf("the failed key: %d, want taken over and run (201)", st)
	}
	if st, _ := serve("failed", "a", 0, true); st != http.StatusCreated {
		t.Errorf("the failed key's retry: %d, want the 201 replayed", st)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times on the full store, want once (the failed key's takeover)", n)
	}
	if err := eng.Commit(ctx, inflight, adapterkit.Response{Status: http.StatusCreated}); err != nil {
		t.Errorf("the in-flight owner's commit on a full store: %v", err)
	}

	// Past retention the filler expires and is reclaimed for a new key.
	clk.Advance(time.Hour + time.Minute)
	if st, _ := serve("new", "a", http.StatusCreated, true); st != http.StatusCreated {
		t.Errorf("a new key once records expired: %d, want 201", st)
	}
	if n := s.Len(); n > memstore.DefaultMaxEntries {
		t.Errorf("Len %d over the bound %d", n, memstore.DefaultMaxEntries)
	}
}
