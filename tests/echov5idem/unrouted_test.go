package echov5idem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core"
)

// TestGlobalMiddlewareLeavesUnknownRoutesAlone: mounted with e.Use or
// Group.Use, as echo teaches, a POST to a path no route matches gets echo's
// own 404 (405 for a known path with another method; a RouteNotFound
// handler's answer), with or without a key; nothing is recorded. A known
// route still requires its key.
func TestGlobalMiddlewareLeavesUnknownRoutesAlone(t *testing.T) {
	eng, store := newEngine(t)
	m := mw(t, eng)
	ok := func(c *echo.Context) error { return c.String(http.StatusCreated, "ok") }
	e := echo.New()
	e.Use(m)
	e.POST("/v1/orders/:id", ok)
	e.GET("/v1/list", ok)
	e.RouteNotFound("/custom/*", func(c *echo.Context) error { return c.String(http.StatusNotFound, "custom 404") })
	g := e.Group("/g")
	g.Use(m)
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
			w := serve(e, http.MethodPost, path, key, strings.NewReader("{}"))
			if w.Code != want || w.Header().Get(core.ReplayedHeader) != "" {
				t.Errorf("POST %s key=%q: %d %q, want echo's %d", path, key, w.Code, w.Body.String(), want)
			}
		}
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d records after requests to unknown routes, want 0", n)
	}
	for _, path := range []string{"/v1/orders/1", "/g/orders/1"} {
		if w := serve(e, http.MethodPost, path, "", strings.NewReader("{}")); w.Code != http.StatusBadRequest {
			t.Errorf("known route %s without a key: %d, want 400 missing-key", path, w.Code)
		}
	}
}

// TestPreMiddlewareProtectsByPath: under e.Pre the router has not run, so
// the middleware cannot tell a route from none: it protects every POST
// (rather than letting them through unprotected) and records the path.
func TestPreMiddlewareProtectsByPath(t *testing.T) {
	eng, store := newEngine(t)
	e := echo.New()
	e.Pre(mw(t, eng))
	runs := 0
	e.POST("/v1/orders/:id", func(c *echo.Context) error {
		runs++
		return c.String(http.StatusCreated, "ok")
	})
	if w := serve(e, http.MethodPost, "/v1/orders/1", "", strings.NewReader("{}")); w.Code != http.StatusBadRequest {
		t.Errorf("without a key under Pre: %d %q, want 400", w.Code, w.Body.String())
	}
	for i := range 2 {
		w := serve(e, http.MethodPost, "/v1/orders/1", "k-pre", strings.NewReader("{}"))
		if w.Code != http.StatusCreated || replayed(w) != (i == 1) {
			t.Errorf("request %d under Pre: %d replayed=%v", i, w.Code, replayed(w))
		}
	}
	if runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}
	rec, err := store.Get(t.Context(), "", "k-pre")
	if err != nil || rec.Route != "/v1/orders/1" {
		t.Errorf("record route %q (%v), want the path /v1/orders/1", rec.Route, err)
	}
}
