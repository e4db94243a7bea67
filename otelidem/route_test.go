package otelidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/nethttpidem"
)

// TestRouteAttributeBounded: a request whose route no router matched
// carries its raw path, and 10 000 distinct paths must not become 10 000
// metric series. Around a whole ServeMux, nethttpidem asks the mux for the
// pattern, and lets unmatched requests through (a bypass, whose event must
// not name the path either); around any other routing handler (chi, a
// chain ending in a mux) it cannot know, and every request reaches the
// engine with its path as its route. Routes mounted on the mux keep their
// template as http.route.
func TestRouteAttributeBounded(t *testing.T) {
	const paths = 10_000
	r := newRig(t)
	eng := r.engine(t)
	mw, err := nethttpidem.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { w.WriteHeader(http.StatusCreated) })
	// A handler whose lease is taken away under it (as idemctl release
	// would): its commit is fenced out, which lease_lost reports.
	loses := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if l, ok := storekit.LeaseFromContext(req.Context()); ok {
			if err := r.mem.Fail(req.Context(), l.Fence()); err != nil {
				t.Errorf("fail under the owner: %v", err)
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	inner := http.NewServeMux()
	inner.Handle("POST /v1/orders/{id}", ok)
	inner.Handle("POST /v1/lost/{id}", loses)
	inner.Handle("POST /chain/v1/orders/{id}", ok)
	whole := mw(inner) // wrapping a whole ServeMux: its pattern, or a bypass
	// wrapping a handler that routes after it: the route is the path
	chain := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { inner.ServeHTTP(w, r) }))
	mounted := http.NewServeMux()
	mounted.Handle("POST /v1/pay/{id}", mw(ok)) // mounted on the route: a template

	do := func(method, path, key, body string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		switch {
		case strings.HasPrefix(path, "/v1/pay/"):
			mounted.ServeHTTP(w, req)
		case strings.Contains(path, "/chain/"):
			chain.ServeHTTP(w, req)
		default:
			whole.ServeHTTP(w, req)
		}
		return w.Code
	}
	for i := range paths {
		var path string
		switch i % 6 {
		case 0:
			path = fmt.Sprintf("/v1/orders/%d", i) // matched by the mux
		case 1:
			path = fmt.Sprintf("/scan/%d/wp-login.php", i) // matched by nothing: 404
		case 2:
			path = fmt.Sprintf("/v1/lost/%d", i)
		case 3:
			path = fmt.Sprintf("/v1/pay/%d", i) // the template route
		case 4:
			path = fmt.Sprintf("/chain/v1/orders/%d", i) // through the chain: its path
		case 5:
			path = fmt.Sprintf("/chain/scan/%d", i) // through the chain, matched by nothing
		}
		key := fmt.Sprint("key-", i)
		do(http.MethodPost, path, key, "a") // claim, commit (or lease lost)
		do(http.MethodPost, path, key, "b") // mismatch (or a new claim after the loss)
		do(http.MethodPost, path, "", "a")  // rejected: missing key (or a bypass)
		do(http.MethodPost, path, key, "a") // replay (or claim)
		do(http.MethodGet, path, "", "")    // bypass: a safe method
	}

	series := map[string]map[attribute.Distinct]bool{}
	routes := map[string]bool{}
	for _, p := range r.collect(t) {
		if series[p.name] == nil {
			series[p.name] = map[attribute.Distinct]bool{}
		}
		series[p.name][p.attrs.Equivalent()] = true
		if v, ok := p.attrs.Value("http.route"); ok {
			routes[v.AsString()] = true
		}
	}
	for _, name := range []string{"idem.decisions", "idem.commits", "idem.store.duration", "idem.lease.lost"} {
		if len(series[name]) == 0 {
			t.Errorf("%s: no series (the test drove nothing)", name)
		}
	}
	// Outcomes × problems × statuses × (template or none): a few dozen at
	// most, whatever the number of paths.
	const bound = 40
	for name, s := range series {
		if len(s) > bound {
			t.Errorf("%s: %d series for %d distinct paths, want at most %d", name, len(s), paths, bound)
		}
	}
	templates := map[string]bool{"/v1/pay/{id}": true, "/v1/orders/{id}": true, "/v1/lost/{id}": true}
	for tmpl := range templates {
		if !routes[tmpl] {
			t.Errorf("the template %s is not exported as http.route", tmpl)
		}
	}
	var others int
	for route := range routes {
		if !templates[route] {
			others++
		}
	}
	if others > 0 {
		t.Errorf("%d http.route values that are no template of the application (paths)", others)
	}
}
