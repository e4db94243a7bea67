package core_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// TestRetryAfterOption: every answer that invites a retry carries the
// WithRetryAfter hint, the lease-lost 409 and the 503s included.
func TestRetryAfterOption(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace(), core.WithRetryAfter(4*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*adapterkit.Response{
		"lease lost":        eng.CommitErrorResponse(core.ErrLeaseLost),
		"commit failure":    eng.CommitErrorResponse(errors.New("connection reset")),
		"store unavailable": eng.Problem(problem.StoreUnavailable, "x"),
	} {
		if got := r.Header.Get("Retry-After"); got != "4" {
			t.Errorf("%s: Retry-After %q, want 4", name, got)
		}
	}
	if r := eng.CommitErrorResponse(core.ErrLeaseLost); r.Status != http.StatusConflict {
		t.Errorf("lease lost: %d, want 409", r.Status)
	}
}

// cancelStore fails Claim as a driver does when the request's context is
// cancelled.
type cancelStore struct{ core.Store }

func (s cancelStore) Claim(ctx context.Context, _ storekit.ClaimRequest) (storekit.ClaimResult, error) {
	<-ctx.Done()
	return storekit.ClaimResult{}, ctx.Err()
}

// TestCanceledIsNotStoreUnavailable: a client that goes away before the
// claim is no store outage: no error, request-canceled, and the observer
// says canceled.
func TestCanceledIsNotStoreUnavailable(t *testing.T) {
	var kinds []string
	eng, err := core.New(cancelStore{memstore.New()}, core.WithSharedKeySpace(),
		core.WithObserver(func(ev core.Event) { kinds = append(kinds, ev.Kind) }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	d, err := eng.Decide(ctx, core.Request{Method: "POST", Route: "/pay",
		Header: http.Header{"Idempotency-Key": {"k-cancel"}}, Body: strings.NewReader("{}")})
	if err != nil {
		t.Fatalf("Decide: %v, want no system error", err)
	}
	if d.Outcome != core.Reject || d.Problem != problem.Canceled || d.Problem == problem.StoreUnavailable {
		t.Fatalf("decision %v %q, want reject %q", d.Outcome, d.Problem, problem.Canceled)
	}
	if len(kinds) != 1 || kinds[0] != core.EventCanceled {
		t.Errorf("events %v, want [canceled]", kinds)
	}
}
