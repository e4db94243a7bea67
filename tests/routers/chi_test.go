package routers

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
)

// counter is the business handler: it counts executions and answers the
// same bytes whichever router served it.
type counter struct{ runs atomic.Int64 }

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	n := c.runs.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"run":%d,"path":%q}`, n, r.URL.Path)
}

func newMiddleware(t *testing.T, eng *core.Engine, opts ...nethttpidem.Option) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := nethttpidem.New(eng, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

type answer struct {
	status   int
	body     string
	replayed bool
}

// post sends a POST with key (none when empty); safe from any goroutine.
func post(url, key, body string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b), resp.Header.Get(core.ReplayedHeader) == "true"}, err
}

func mustPost(t *testing.T, url, key, body string) answer {
	t.Helper()
	a, err := post(url, key, body)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return a
}

// chiOnRoutes mounts the middleware the way nethttpidem documents for
// chi: on the routes (r.With) and in a group (r.Use inside r.Group), both
// run after chi has routed, so r.Pattern holds chi's pattern.
func chiOnRoutes(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
	r := chi.NewRouter()
	r.With(mw).Post("/v1/payments", h.ServeHTTP)
	r.Route("/v1/orders", func(r chi.Router) {
		r.Group(func(r chi.Router) {
			r.Use(mw)
			r.Post("/{id:[0-9]+}/confirm", h.ServeHTTP)
		})
	})
	r.With(mw).Post("/v1/files/*", h.ServeHTTP)
	r.Get("/v1/list", h.ServeHTTP)
	return r
}

// TestChiRouteTemplate: mounted on chi's routes, idem records chi's
// pattern in the form every adapter records ("{id:[0-9]+}" is "{id}", the
// final "*" is "{*}"), not the path; paths chi does not serve get chi's own
// 404 or 405, with or without a key, and nothing is recorded.
func TestChiRouteTemplate(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(chiOnRoutes(newMiddleware(t, eng), &counter{}))
	defer srv.Close()

	cases := []struct{ target, want string }{
		{"/v1/payments", "/v1/payments"},
		{"/v1/orders/42/confirm", adapterkit.CanonicalRoute("/v1/orders/:id/confirm")},
		{"/v1/files/a/b.txt", adapterkit.CanonicalRoute("/v1/files/*")},
	}
	for i, tc := range cases {
		key := fmt.Sprintf("k-%d", i)
		if a := mustPost(t, srv.URL+tc.target, key, "{}"); a.status != http.StatusCreated {
			t.Fatalf("POST %s: %+v", tc.target, a)
		}
		rec, err := store.Get(t.Context(), "", key)
		if err != nil || rec.Route != tc.want {
			t.Errorf("POST %s recorded route %q (%v), want %q", tc.target, rec.Route, err, tc.want)
		}
		if a := mustPost(t, srv.URL+tc.target, "", "{}"); a.status != http.StatusBadRequest {
			t.Errorf("POST %s without a key: %+v, want 400", tc.target, a)
		}
	}
	before := store.Len()
	unknown := map[string]int{"/nope": 404, "/v1/orders/abc/confirm": 404, "/v1/list": 405}
	for _, key := range []string{"", "k-unknown"} {
		for path, want := range unknown {
			if a := mustPost(t, srv.URL+path, key, "{}"); a.status != want || a.replayed {
				t.Errorf("POST %s key=%q: %+v, want chi's %d", path, key, a, want)
			}
		}
	}
	if n := store.Len() - before; n != 0 {
		t.Errorf("%d records for unknown routes, want 0", n)
	}
}

// chiUseFind mounts the middleware before chi routes (r.Use on the
// router), with the route asked of the router, and what it does not find
// skipped: the documented way to mount idem with r.Use.
func chiUseFind(t *testing.T, eng *core.Engine, h http.Handler) http.Handler {
	r := chi.NewRouter()
	find := func(req *http.Request) string { return r.Find(chi.NewRouteContext(), req.Method, req.URL.Path) }
	r.Use(newMiddleware(t, eng,
		nethttpidem.WithRoute(find),
		nethttpidem.WithSkip(func(req *http.Request) bool { return find(req) == "" })))
	r.Post("/v1/payments", h.ServeHTTP)
	r.Route("/v1/orders", func(r chi.Router) {
		r.Post("/{id:[0-9]+}/confirm", h.ServeHTTP)
	})
	r.Post("/v1/files/*", h.ServeHTTP)
	r.Get("/v1/list", h.ServeHTTP)
	return r
}

// TestChiUseWithFind: with r.Use, the middleware runs before chi routes;
// WithRoute asking chi's Router.Find gives the same route as mounting on
// the routes, sub-routers included, and WithSkip on the same lookup lets
// unknown paths through to chi's 404 and 405.
func TestChiUseWithFind(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(chiUseFind(t, eng, &counter{}))
	defer srv.Close()
	for i, tc := range []struct{ target, want string }{
		{"/v1/payments", "/v1/payments"},
		{"/v1/orders/42/confirm", "/v1/orders/{id}/confirm"},
		{"/v1/files/a/b.txt", "/v1/files/{*}"},
	} {
		key := fmt.Sprintf("k-%d", i)
		if a := mustPost(t, srv.URL+tc.target, key, "{}"); a.status != http.StatusCreated {
			t.Fatalf("POST %s: %+v", tc.target, a)
		}
		if rec, err := store.Get(t.Context(), "", key); err != nil || rec.Route != tc.want {
			t.Errorf("POST %s recorded route %q (%v), want %q", tc.target, rec.Route, err, tc.want)
		}
	}
	before := store.Len()
	for path, want := range map[string]int{"/nope": 404, "/v1/orders/abc/confirm": 404, "/v1/list": 405} {
		if a := mustPost(t, srv.URL+path, "k-unknown", "{}"); a.status != want {
			t.Errorf("POST %s: %+v, want chi's %d", path, a, want)
		}
	}
	if n := store.Len() - before; n != 0 {
		t.Errorf("%d records for unknown routes, want 0", n)
	}
}

// TestChiConcurrentDuplicates: concurrent requests with one key through
// chi run the handler exactly once; every other answer is the replay or
// 409 in flight.
func TestChiConcurrentDuplicates(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	h := &counter{}
	srv := httptest.NewServer(chiOnRoutes(newMiddleware(t, eng), h))
	defer srv.Close()
	const n = 24
	var wg sync.WaitGroup
	var created, conflicts atomic.Int64
	for range n {
		wg.Go(func() {
			a, err := post(srv.URL+"/v1/orders/7/confirm", "k-race", `{"amount":1}`)
			switch {
			case err != nil:
				t.Errorf("POST: %v", err)
			case a.status == http.StatusCreated:
				created.Add(1)
			case a.status == http.StatusConflict:
				conflicts.Add(1)
			default:
				t.Errorf("answer %+v, want 201 or 409", a)
			}
		})
	}
	wg.Wait()
	if runs := h.runs.Load(); runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}
	if created.Load()+conflicts.Load() != n || created.Load() < 1 {
		t.Errorf("%d created, %d in flight, of %d", created.Load(), conflicts.Load(), n)
	}
}
