package core_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// TestPathRouteNotInEvents: a request without a route template has its
// path (from Target, without the query) recorded and fingerprinted in its
// place, but no event names it, so an observer cannot turn client-chosen
// paths into metric labels. A template is named.
func TestPathRouteNotInEvents(t *testing.T) {
	var events []core.Event
	mem := memstore.New()
	eng, err := core.New(mem, core.WithSharedKeySpace(), core.WithObserver(func(ev core.Event) { events = append(events, ev) }))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		route, target string
		want          string // in events
		recorded      string
	}{
		{"/v1/orders/:id", "/v1/orders/7?x=1", "/v1/orders/{id}", "/v1/orders/{id}"},
		{"", "/scan/1/wp-login.php?a=b", "", "/scan/1/wp-login.php"},
	} {
		events = nil
		h := http.Header{"Idempotency-Key": {"k-" + c.target}}
		rq := core.Request{Method: "POST", Route: c.route, Target: c.target, Header: h}
		d, err := eng.Decide(t.Context(), rq)
		if err != nil || d.Outcome != core.Proceed {
			t.Fatalf("%s: %v %v", c.target, d.Outcome, err)
		}
		if err := eng.Commit(t.Context(), d, adapterkit.Response{Status: http.StatusCreated}); err != nil {
			t.Fatal(err)
		}
		rq.Header = http.Header{}
		if d, _ := eng.Decide(t.Context(), rq); d.Outcome != core.Reject { // missing key
			t.Fatalf("%s without a key: %v", c.target, d.Outcome)
		}
		if len(events) != 3 {
			t.Fatalf("%s: %d events, want claim, commit, rejected", c.target, len(events))
		}
		for _, ev := range events {
			if ev.Route != c.want {
				t.Errorf("%s: %s event names route %q, want %q", c.target, ev.Kind, ev.Route, c.want)
			}
		}
		rec, err := mem.Get(t.Context(), "", "k-"+c.target)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Route != c.recorded {
			t.Errorf("recorded route %q, want %q", rec.Route, c.recorded)
		}
	}
}
