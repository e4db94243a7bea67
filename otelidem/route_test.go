package otelidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/nethttpidem"
)

// TestRouteAttributeBounded: a request whose route no router matched
// carries its raw path, and 10 000 distinct paths must not become 10 000
// metric series. nethttpidem wrapping a whole mux is the common case: the
// mux sets r.Pattern only after the middleware ran, so every request,
// matched or not, reaches the engine with its path. Routes mounted on the
// mux keep their template as http.route.
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
		if l, ok := core.LeaseFromContext(req.Context()); ok {
			if err := r.mem.Fail(req.Context(), l.Fence()); err != nil {
				t.Errorf("fail under the owner: %v", err)
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	inner := http.NewServeMux()
	inner.Handle("POST /v1/orders/{id}", ok)
	inner.Handle("POST /v1/lost/{id}", loses)
	whole := mw(inner) // wrapping a whole mux: the route is the path
	mounted := http.NewServeMux()
	mounted.Handle("POST /v1/pay/{id}", mw(ok)) // mounted on the route: a template

	do := func(path, key, body string) int {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		if strings.HasPrefix(path, "/v1/pay/") {
			mounted.ServeHTTP(w, req)
		} else {
			whole.ServeHTTP(w, req)
		}
		return w.Code
	}
	for i := range paths {
		var path string
		switch i % 4 {
		case 0:
			path = fmt.Sprintf("/v1/orders/%d", i) // matched by the inner mux
		case 1:
			path = fmt.Sprintf("/scan/%d/wp-login.php", i) // matched by nothing: 404
		case 2:
			path = fmt.Sprintf("/v1/lost/%d", i)
		case 3:
			path = fmt.Sprintf("/v1/pay/%d", i) // the template route
		}
		key := fmt.Sprint("key-", i)
		do(path, key, "a") // claim, commit (or lease lost)
		do(path, key, "b") // mismatch (or a new claim after the loss)
		do(path, "", "a")  // rejected: missing key
		do(path, key, "a") // replay (or claim)
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
	if !routes["/v1/pay/{id}"] {
		t.Errorf("the mounted route's template is not exported as http.route (routes: %d)", len(routes))
	}
	if len(routes) > 1 {
		t.Errorf("%d distinct http.route values, want only the template /v1/pay/{id}", len(routes))
	}
}
