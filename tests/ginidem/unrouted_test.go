package ginidem_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/ginidem"
)

// TestGlobalMiddlewareLeavesUnknownRoutesAlone: mounted with r.Use, as gin
// teaches, a POST to a path no route matches gets gin's own 404 (405 for a
// known path with another method, with HandleMethodNotAllowed), with or
// without a key; nothing is recorded.
func TestGlobalMiddlewareLeavesUnknownRoutesAlone(t *testing.T) {
	store := memstore.New()
	eng := newEngineOn(t, store)
	mw, err := ginidem.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(mw)
	r.POST("/v1/orders/:id", func(c *gin.Context) { c.String(http.StatusCreated, "ok") })
	r.GET("/v1/list", func(c *gin.Context) { c.String(http.StatusOK, "list") })

	for _, key := range []string{"", "k-unknown"} {
		for path, want := range map[string]int{"/nope": http.StatusNotFound, "/v1/list": http.StatusMethodNotAllowed} {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			if w.Code != want || w.Header().Get(core.ReplayedHeader) != "" {
				t.Errorf("POST %s key=%q: %d %q, want gin's %d", path, key, w.Code, w.Body.String(), want)
			}
		}
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d records after requests to unknown routes, want 0", n)
	}
	// A known route is still protected.
	req := httptest.NewRequest(http.MethodPost, "/v1/orders/1", strings.NewReader("{}"))
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	if w.Code != http.StatusBadRequest {
		t.Errorf("known route without a key: %d, want 400 missing-key", w.Code)
	}
}
