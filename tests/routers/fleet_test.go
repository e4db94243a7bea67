package routers

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// routerFleet starts, on one store, one engine per instance as separate
// processes would have: chi with idem on its routes, chi with idem in
// r.Use asking Router.Find, and ServeMux with idem around each handler
// and around the whole mux. Every instance serves the same routes, each in
// its router's syntax.
func routerFleet(t *testing.T, store core.Store, h http.Handler) map[string]string {
	t.Helper()
	newEng := func() *core.Engine {
		eng, err := core.New(store, core.WithSharedKeySpace())
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	muxPatterns := []string{"POST /v1/payments", "POST /v1/orders/{id}/confirm", "POST /v1/files/{rest...}", "GET /v1/list"}
	perHandler := http.NewServeMux()
	mw := newMiddleware(t, newEng())
	for _, p := range muxPatterns {
		perHandler.Handle(p, mw(h))
	}
	whole := http.NewServeMux()
	for _, p := range muxPatterns {
		whole.Handle(p, h)
	}
	handlers := map[string]http.Handler{
		"chi-routes":      chiOnRoutes(newMiddleware(t, newEng()), h),
		"chi-use-find":    chiUseFind(t, newEng(), h),
		"mux-per-handler": perHandler,
		"mux-wrapped":     newMiddleware(t, newEng())(whole),
	}
	urls := map[string]string{}
	for name, hh := range handlers {
		srv := httptest.NewServer(hh)
		t.Cleanup(srv.Close)
		urls[name] = srv.URL
	}
	return urls
}

// TestRouterFleet: chi and ServeMux instances record the same route and
// fingerprint for the same request, so a key first served by any of them
// replays through every other (the handler runs once across the fleet),
// and the same key with another body is 422 everywhere.
func TestRouterFleet(t *testing.T) {
	t.Run("memstore", func(t *testing.T) { runRouterFleet(t, memstore.New()) })
	t.Run("postgres", func(t *testing.T) { runRouterFleet(t, postgresStore(t)) })
}

func runRouterFleet(t *testing.T, store core.Store) {
	h := &counter{}
	urls := routerFleet(t, store, h)
	const body = `{"amount":1000,"currency":"JPY"}`
	for first, base := range urls {
		for _, path := range []string{"/v1/payments", "/v1/orders/42/confirm", "/v1/files/a/b.txt"} {
			key := "fleet-" + first + strings.ReplaceAll(path, "/", "-")
			before := h.runs.Load()
			a := mustPost(t, base+path, key, body)
			if a.status != http.StatusCreated || a.replayed {
				t.Fatalf("%s %s first: %+v", first, path, a)
			}
			for other, obase := range urls {
				r := mustPost(t, obase+path, key, body)
				if !r.replayed || r.status != a.status || r.body != a.body {
					t.Errorf("%s -> %s %s: %+v, want the replay of %+v", first, other, path, r, a)
				}
				if m := mustPost(t, obase+path, key, `{"amount":5}`); m.status != http.StatusUnprocessableEntity {
					t.Errorf("%s -> %s %s, other body: %+v, want 422", first, other, path, m)
				}
			}
			if ran := h.runs.Load() - before; ran != 1 {
				t.Errorf("%s %s: handler ran %d times across the fleet, want 1", first, path, ran)
			}
		}
	}
}
