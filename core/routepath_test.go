package core_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// TestRouteIsPathNotInEvents: a route that is the request's path is
// recorded and fingerprinted, but no event names it, so an observer cannot
// turn client-chosen paths into metric labels. A template is named.
func TestRouteIsPathNotInEvents(t *testing.T) {
	var events []core.Event
	mem := memstore.New()
	eng, err := core.New(mem, core.WithSharedKeySpace(), core.WithObserver(func(ev core.Event) { events = append(events, ev) }))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		route  string
		isPath bool
		want   string
	}{
		{"/v1/orders/:id", false, "/v1/orders/{id}"},
		{"/scan/1/wp-login.php", true, ""},
	} {
		events = nil
		h := http.Header{"Idempotency-Key": {"k-" + c.route}}
		rq := core.Request{Method: "POST", Route: c.route, RouteIsPath: c.isPath, Target: c.route, Header: h}
		d, err := eng.Decide(t.Context(), rq)
		if err != nil || d.Outcome != core.Proceed {
			t.Fatalf("%s: %v %v", c.route, d.Outcome, err)
		}
		if err := eng.Commit(t.Context(), d, adapterkit.Response{Status: http.StatusCreated}); err != nil {
			t.Fatal(err)
		}
		rq.Header = http.Header{}
		if d, _ := eng.Decide(t.Context(), rq); d.Outcome != core.Reject { // missing key
			t.Fatalf("%s without a key: %v", c.route, d.Outcome)
		}
		if len(events) != 3 {
			t.Fatalf("%s: %d events, want claim, commit, rejected", c.route, len(events))
		}
		for _, ev := range events {
			if ev.Route != c.want {
				t.Errorf("%s: %s event names route %q, want %q", c.route, ev.Kind, ev.Route, c.want)
			}
		}
		rec, err := mem.Get(t.Context(), "", "k-"+c.route)
		if err != nil {
			t.Fatal(err)
		}
		if want := adapterkit.CanonicalRoute(c.route); rec.Route != want {
			t.Errorf("recorded route %q, want %q", rec.Route, want)
		}
	}
}
