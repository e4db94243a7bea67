package nethttpidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/nethttpidem/nethttpidemtest"
)

// postTo sends a POST with key to url, with the Host header host when not
// empty, and returns status, body and headers.
func postTo(t *testing.T, url, host, key string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestServeMuxPatterns: Go 1.22+ ServeMux patterns (method, host,
// "{rest...}", "{$}", none of them) are recorded as the route in canonical
// form, the same whether the middleware wraps each handler (r.Pattern) or
// the whole mux (ServeMux.Handler), and the same as the gin/echo/fiber
// spelling of the route: a key first served by one mounting replays
// through the other, the handler running once.
func TestServeMuxPatterns(t *testing.T) {
	cases := []struct {
		pattern, host, target string
		framework             string // the route as gin, echo and fiber spell it
	}{
		{"POST /payments/{id}", "", "/payments/7", "/payments/:id"},
		{"POST api.example.com/payments/{id}", "api.example.com", "/payments/7", "/payments/:id"},
		{"POST /files/{rest...}", "", "/files/a/b/c", "/files/*"},
		{"POST /v1/items/{$}", "", "/v1/items/", "/v1/items/"},
		{"/v1/orders/{id}/confirm", "", "/v1/orders/9/confirm", "/v1/orders/:id/confirm"},
	}
	for _, tc := range cases {
		t.Run(tc.pattern, func(t *testing.T) {
			store := memstore.New()
			eng, err := core.New(store, core.WithSharedKeySpace())
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, r.URL.Path)
			})
			mw, err := nethttpidem.New(eng)
			if err != nil {
				t.Fatal(err)
			}
			perHandler := http.NewServeMux()
			perHandler.Handle(tc.pattern, mw(h))
			wholeMux := http.NewServeMux()
			wholeMux.Handle(tc.pattern, h)
			a, b := httptest.NewServer(perHandler), httptest.NewServer(mw(wholeMux))
			defer a.Close()
			defer b.Close()

			want := adapterkit.CanonicalRoute(tc.framework)
			for i, first := range []*httptest.Server{a, b} {
				other := [2]*httptest.Server{b, a}[i]
				key := "k-" + [2]string{"handler", "mux"}[i]
				before := runs.Load()
				if s, body, _ := postTo(t, first.URL+tc.target, tc.host, key); s != http.StatusCreated {
					t.Fatalf("first via %s: %d %q", key, s, body)
				}
				rec, err := store.Get(t.Context(), "", key)
				if err != nil || rec.Route != want {
					t.Errorf("%s: recorded route %q (%v), want %q (canonical %q)", key, rec.Route, err, want, tc.framework)
				}
				if s, body, hdr := postTo(t, other.URL+tc.target, tc.host, key); s != http.StatusCreated || hdr.Get(core.ReplayedHeader) != "true" {
					t.Errorf("%s retried through the other mounting: %d %q replayed=%q, want the replay", key, s, body, hdr.Get(core.ReplayedHeader))
				}
				if n := runs.Load() - before; n != 1 {
					t.Errorf("%s: handler ran %d times, want 1", key, n)
				}
			}
		})
	}
}

// TestRouterPatternSpelling: chi (v5.2 and later) sets r.Pattern to its
// own route pattern once it has routed, so the middleware mounted on a chi
// route (r.With, r.Group) finds it there: chi's "{id:regexp}" and final
// "/*" are read as chi means them, recorded as every adapter records the
// route, while a ServeMux pattern's ':' and '*' stay literal.
func TestRouterPatternSpelling(t *testing.T) {
	cases := []struct{ pattern, target, want string }{
		{"/re/{id:[0-9]+}", "/re/12", "/re/{id}"},                                                           // chi regexp
		{"/files/*", "/files/a/b", "/files/{*}"},                                                            // chi catch-all
		{"/v1/{org}/things:batch", "/v1/acme/things:batch", `/v1/{org}/things\:batch`},                      // ':' literal in both
		{"POST /v1/glob*", "/v1/glob*", `/v1/glob\*`},                                                       // ServeMux: '*' literal
		{"/v1/{id:[a-z]+}/files/*", "/v1/ab/files/x", "/v1/{id}/files/{*}"},                                 // both chi forms
		{"POST /v1/orders/{id}/items:cancel", "/v1/orders/1/items:cancel", `/v1/orders/{id}/items\:cancel`}, // ServeMux
	}
	for _, tc := range cases {
		t.Run(tc.pattern, func(t *testing.T) {
			store := memstore.New()
			eng, err := core.New(store, core.WithSharedKeySpace())
			if err != nil {
				t.Fatal(err)
			}
			mw, err := nethttpidem.New(eng)
			if err != nil {
				t.Fatal(err)
			}
			inner := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
			// The router that routed before the middleware ran, as chi does.
			router := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Pattern = tc.pattern
				inner.ServeHTTP(w, r)
			})
			srv := httptest.NewServer(router)
			defer srv.Close()
			if s, body, _ := postTo(t, srv.URL+tc.target, "", "k"); s != http.StatusCreated {
				t.Fatalf("%d %q", s, body)
			}
			rec, err := store.Get(t.Context(), "", "k")
			if err != nil || rec.Route != tc.want {
				t.Errorf("pattern %q recorded as %q (%v), want %q", tc.pattern, rec.Route, err, tc.want)
			}
		})
	}
}

// TestWithRouteEmptyIsThePath: a WithRoute function that finds no route
// (chi's Router.Find for a path nothing serves) returns ""; the request is
// then protected under its path, as without a pattern, not recorded under
// an empty route shared by every such path.
func TestWithRouteEmptyIsThePath(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	mw, err := nethttpidem.New(eng, nethttpidem.WithRoute(func(*http.Request) string { return "" }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })))
	defer srv.Close()
	if s, body, _ := postTo(t, srv.URL+"/a/1", "", "k"); s != http.StatusCreated {
		t.Fatalf("%d %q", s, body)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.Route != "/a/1" {
		t.Errorf("recorded route %q (%v), want the path /a/1", rec.Route, err)
	}
}

// wrappedMuxAdapter is the suite's adapter with the middleware around the
// whole ServeMux (http.ListenAndServe(addr, mw(mux))), the other mounting
// New documents: the route comes from ServeMux.Handler.
var wrappedMuxAdapter = idemtest.Adapter{
	Name:            "nethttp-wrapped-mux",
	NoHandlerErrors: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		mw, err := nethttpidem.New(eng, nethttpidemtest.Options(cfg)...)
		if err != nil {
			return "", err
		}
		mux := http.NewServeMux()
		for _, rt := range routes {
			mux.Handle(rt.Method+" "+rt.Path, rt.Handler)
		}
		return nethttpidemtest.Serve(t, mw(mux), cfg), nil
	},
}

func TestConformanceWrappedMux(t *testing.T) {
	idemtest.Run(t, wrappedMuxAdapter, newMemstore)
}
