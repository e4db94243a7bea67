package echov5idem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
			assert.Equal(t, want, w.Code, "POST %s key=%q: echo's answer; body %q", path, key, w.Body.String())
			assert.False(t, replayed(w), "POST %s key=%q: replayed", path, key)
		}
	}
	assert.Zero(t, store.Len(), "records after requests to unknown routes")
	for _, path := range []string{"/v1/orders/1", "/g/orders/1"} {
		w := serve(e, http.MethodPost, path, "", strings.NewReader("{}"))
		assert.Equal(t, http.StatusBadRequest, w.Code, "known route %s without a key: 400 missing-key", path)
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
	w := serve(e, http.MethodPost, "/v1/orders/1", "", strings.NewReader("{}"))
	assert.Equal(t, http.StatusBadRequest, w.Code, "without a key under Pre; body %q", w.Body.String())
	for i := range 2 {
		w := serve(e, http.MethodPost, "/v1/orders/1", "k-pre", strings.NewReader("{}"))
		assert.Equal(t, http.StatusCreated, w.Code, "request %d under Pre", i)
		assert.Equal(t, i == 1, replayed(w), "request %d under Pre: replayed", i)
	}
	assert.Equal(t, 1, runs, "handler runs")
	rec, err := store.Get(t.Context(), "", "k-pre")
	require.NoError(t, err)
	assert.Equal(t, "/v1/orders/1", rec.Route, "record route: the path")
}
