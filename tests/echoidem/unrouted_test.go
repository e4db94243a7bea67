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
