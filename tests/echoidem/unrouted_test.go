package echoidem_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echoidem"
)

// TestGlobalMiddlewareLeavesUnknownRoutesAlone: mounted with e.Use or
// Group.Use, as echo teaches, a POST to a path no route matches gets echo's
// own 404 (405 for a known path with another method; a RouteNotFound
// handler's answer), with or without a key; nothing is recorded.
func TestGlobalMiddlewareLeavesUnknownRoutesAlone(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	mw, err := echoidem.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	ok := func(c echo.Context) error { return c.String(http.StatusCreated, "ok") }
	e := echo.New()
	e.Use(mw)
	e.POST("/v1/orders/:id", ok)
	e.GET("/v1/list", ok)
	e.RouteNotFound("/custom/*", func(c echo.Context) error { return c.String(http.StatusNotFound, "custom 404") })
	g := e.Group("/g")
	g.Use(mw)
	g.POST("/orders/:id", ok)

	cases := map[string]int{
		"/nope":      http.StatusNotFound,
		"/v1/nope":   http.StatusNotFound,
		"/v1/orders": http.StatusNotFound,
		"/v1/list":   http.StatusMethodNotAllowed,
		"/custom/x":  http.StatusNotFound,
		"/g/nope":    http.StatusNotFound,
		"/g/other/1": http.StatusNotFound,
	}
	for _, key := range []string{"", "k-unknown"} {
		for path, want := range cases {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			w := httptest.NewRecorder()
			e.ServeHTTP(w, req)
			if w.Code != want || w.Header().Get(core.ReplayedHeader) != "" {
				t.Errorf("POST %s key=%q: %d %q, want echo's %d", path, key, w.Code, w.Body.String(), want)
			}
		}
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d records after requests to unknown routes, want 0", n)
	}
	for _, path := range []string{"/v1/orders/1", "/g/orders/1"} {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}")))
		if w.Code != http.StatusBadRequest {
			t.Errorf("known route %s without a key: %d, want 400 missing-key", path, w.Code)
		}
	}
}

// TestPreMiddlewareProtectsByPath: under e.Pre the router has not run, so
// c.Path() is empty as for a path nothing serves; the middleware asks the
// router, protects a request a route will serve (under its path, as the
// package documentation says) and still lets a miss through to echo's 404.
// The old code let every request under Pre through unprotected.
func TestPreMiddlewareProtectsByPath(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.Pre(mw(eng))
	runs := 0
	e.POST("/v1/orders/:id", func(c echo.Context) error {
		runs++
		return c.String(http.StatusCreated, "ok")
	})
	send := func(path, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		return w
	}
	if w := send("/v1/orders/1", ""); w.Code != http.StatusBadRequest {
		t.Errorf("without a key under Pre: %d %q, want 400", w.Code, w.Body.String())
	}
	for i := range 2 {
		w := send("/v1/orders/1", "k-pre")
		if w.Code != http.StatusCreated || (w.Header().Get(core.ReplayedHeader) == "true") != (i == 1) {
			t.Errorf("request %d under Pre: %d replayed=%q", i, w.Code, w.Header().Get(core.ReplayedHeader))
		}
	}
	if runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}
	rec, err := store.Get(t.Context(), "", "k-pre")
	if err != nil || rec.Route != "/v1/orders/1" {
		t.Errorf("record route %q (%v), want the path /v1/orders/1", rec.Route, err)
	}
	if w := send("/nope", "k-nope"); w.Code != http.StatusNotFound {
		t.Errorf("unknown path under Pre: %d %q, want echo's 404", w.Code, w.Body.String())
	}
	if n := store.Len(); n != 1 {
		t.Errorf("%d records, want 1", n)
	}
}
