package otelidem_test

import (
	"context"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
)

// TestRolloutCountsRequestsWithoutKey: while keys are optional
// (core.WithKeyRequired(false)), idem.decisions tells the POSTs that came
// without a key (bypass, idem.problem=missing-key) from the requests idem
// does not guard at all (a GET: bypass, no problem) and from the keyed ones
// (claim, replay): the numbers a staged roll-out waits on before it
// requires keys.
func TestRolloutCountsRequestsWithoutKey(t *testing.T) {
	r := newRig(t)
	eng := r.engine(t, core.WithKeyRequired(false))
	ctx := context.Background()
	decide := func(q core.Request) {
		t.Helper()
		d, err := eng.Decide(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if d.Outcome == core.Proceed {
			if err := eng.Commit(d.Context(ctx), d, adapterkit.Response{Status: http.StatusCreated}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 3 {
		decide(req("", `{}`)) // no key: passes through unprotected
	}
	decide(core.Request{Method: "GET", Route: "/pay", Target: "/pay", Header: http.Header{}, Body: strings.NewReader("")})
	decide(req("k-1", `{}`)) // claim
	decide(req("k-1", `{}`)) // replay

	points := r.collect(t)
	missing := attribute.String("idem.problem", problem.MissingKey)
	if got := sum(points, "idem.decisions", outcome("bypass"), missing); got != 3 {
		t.Errorf("bypass without a key = %d, want 3", got)
	}
	if got := sum(points, "idem.decisions", outcome("bypass")); got != 4 {
		t.Errorf("all bypasses = %d, want 4 (3 without a key, 1 GET)", got)
	}
	if got := sum(points, "idem.decisions", outcome("claim")) + sum(points, "idem.decisions", outcome("replay")); got != 2 {
		t.Errorf("keyed decisions = %d, want 2", got)
	}
}
