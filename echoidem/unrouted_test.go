package echoidem_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	require.NoError(t, err)
	mw, err := echoidem.New(eng)
	require.NoError(t, err)
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
			assert.Equal(t, want, w.Code, "POST %s key=%q: echo's answer; body %q", path, key, w.Body.String())
			assert.Empty(t, w.Header().Get(core.ReplayedHeader), "POST %s key=%q: replayed", path, key)
		}
	}
	assert.Zero(t, store.Len(), "records after requests to unknown routes")
	for _, path := range []string{"/v1/orders/1", "/g/orders/1"} {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}")))
		assert.Equal(t, http.StatusBadRequest, w.Code, "known route %s without a key: 400 missing-key", path)
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
	require.NoError(t, err)
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
	w := send("/v1/orders/1", "")
	assert.Equal(t, http.StatusBadRequest, w.Code, "without a key under Pre; body %q", w.Body.String())
	for i := range 2 {
		w := send("/v1/orders/1", "k-pre")
		assert.Equal(t, http.StatusCreated, w.Code, "request %d under Pre", i)
		assert.Equal(t, i == 1, w.Header().Get(core.ReplayedHeader) == "true", "request %d under Pre: replayed", i)
	}
	assert.Equal(t, 1, runs, "handler runs")
	rec, err := store.Get(t.Context(), "", "k-pre")
	if assert.NoError(t, err) {
		assert.Equal(t, "/v1/orders/1", rec.Route, "record route: the path")
	}
	w = send("/nope", "k-nope")
	assert.Equal(t, http.StatusNotFound, w.Code, "unknown path under Pre: echo's 404; body %q", w.Body.String())
	assert.Equal(t, 1, store.Len(), "records")
}

// TestUseWithSkipForUnmatchedRoutes: the skipper idiom from the package
// documentation leaves unrouted requests to Echo when the middleware is
// registered with Echo#Use.
func TestUseWithSkipForUnmatchedRoutes(t *testing.T) {
	s := newServer(t, nil)
	s.E.Use(mw(s.Eng, echoidem.WithSkip(func(c echo.Context) bool { return c.Path() == "" })))
	s.E.POST("/x", func(c echo.Context) error { return c.String(http.StatusCreated, "ok") })
	s.Start()
	r := s.Do("POST", "/nope", "", "")
	assert.Equal(t, http.StatusNotFound, r.Status, "unrouted: %v", r)
	first := s.Do("POST", "/x", "k", "")
	sameAsFirst(t, first, s.Do("POST", "/x", "k", ""))
}
