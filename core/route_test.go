package core_test

import (
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// TestFingerprintGoldenCanonicalRoutes pins what a fleet of mixed
// frameworks records for one route: every spelling fingerprints the same,
// to this value. A release that changes it breaks every record in flight.
func TestFingerprintGoldenCanonicalRoutes(t *testing.T) {
	const want = "7feaac02c8663457b9c675186000fcad17bfff3930e7dfa2bdb9ce9fe7115419"
	var got []string
	for _, tmpl := range []string{"POST /v1/orders/{id}/confirm", "/v1/orders/:id/confirm", "/v1/orders/{id}/confirm"} {
		got = append(got, core.Fingerprint(core.FingerprintInput{
			Method: "POST", Route: adapterkit.CanonicalRoute(tmpl), Target: "/v1/orders/42/confirm", Body: []byte(`{"note":"x"}`),
		}))
	}
	for i := range got {
		if got[i] != got[0] {
			t.Fatalf("spellings fingerprint differently: %v", got)
		}
	}
	if got[0] != want {
		t.Errorf("canonical fingerprint %s, want %s", got[0], want)
	}
}

func TestProblemTable(t *testing.T) {
	for _, p := range problem.All() {
		name, ok := strings.CutPrefix(p.Type, problem.BaseURI)
		if !ok {
			t.Errorf("problem %q: type not under %s", p.Type, problem.BaseURI)
		}
		info, ok := problem.Lookup(name)
		if !ok || info != p || info.Status == 0 || info.Title == "" || info.Detail != "" {
			t.Errorf("problem %q: %+v %v", name, info, ok)
		}
		r := core.ProblemResponse(name, 0, "d")
		if r.Status != info.Status {
			t.Errorf("problem %q: response status %d, table %d", name, r.Status, info.Status)
		}
	}
	if _, ok := problem.Lookup("nope"); ok {
		t.Error("unknown problem found")
	}
}

// TestNoScopeFailsClosed: an engine without a scope function or the
// shared-key-space opt-in refuses a request that names no tenant (401,
// the reason in the event), and adapters cannot be built on it.
func TestNoScopeFailsClosed(t *testing.T) {
	var events []core.Event
	eng, err := core.New(memstore.New(), core.WithObserver(func(ev core.Event) { events = append(events, ev) }))
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Idempotency-Key": {"k-1"}}
	d, err := eng.Decide(t.Context(), core.Request{Method: "POST", Route: "/pay", Header: h})
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != core.Reject || d.Problem != problem.ScopeUnavailable || d.Response.Status != http.StatusUnauthorized {
		t.Fatalf("decision %v %q %d, want reject scope-unavailable 401", d.Outcome, d.Problem, d.Response.Status)
	}
	if len(events) != 1 || !errors.Is(events[0].Err, core.ErrNoScope) || events[0].Problem != problem.ScopeUnavailable {
		t.Fatalf("events %+v, want one carrying ErrNoScope", events)
	}
	if err := eng.CheckScope("xidem.WithScope", false); err == nil || !strings.Contains(err.Error(), "xidem.WithScope") ||
		!strings.Contains(err.Error(), "core.WithSharedKeySpace") {
		t.Errorf("CheckScope without scope: %v, want an error naming both options", err)
	}
	if err := eng.CheckScope("xidem.WithScope", true); err != nil {
		t.Errorf("CheckScope with the adapter's scope: %v", err)
	}
	// With a request scope it proceeds; with the opt-in, so does a request without.
	d, _ = eng.Decide(t.Context(), core.Request{Method: "POST", Route: "/pay", Header: h, Scope: "u1"})
	if d.Outcome != core.Proceed {
		t.Fatalf("with a scope: %v", d.Outcome)
	}
	_ = eng.Abort(t.Context(), d, nil)
	shared, _ := core.New(memstore.New(), core.WithSharedKeySpace())
	if err := shared.CheckScope("xidem.WithScope", false); err != nil {
		t.Errorf("CheckScope with WithSharedKeySpace: %v", err)
	}
	d, _ = shared.Decide(t.Context(), core.Request{Method: "POST", Route: "/pay", Header: h})
	if d.Outcome != core.Proceed {
		t.Fatalf("shared key space: %v", d.Outcome)
	}
	_ = shared.Abort(t.Context(), d, nil)
}
