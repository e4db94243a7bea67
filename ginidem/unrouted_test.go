package ginidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	require.NoError(t, err)
	gin.SetMode(gin.ReleaseMode)
	t.Cleanup(func() { gin.SetMode(gin.TestMode) })
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(mw)
	r.POST("/v1/orders/:id", func(c *gin.Context) { c.String(http.StatusCreated, "ok") })
	r.GET("/v1/list", func(c *gin.Context) { c.String(http.StatusOK, "list") })

	for _, key := range []string{"", "k-unknown"} {
		for path, want := range map[string]int{"/nope": http.StatusNotFound, "/v1/list": http.StatusMethodNotAllowed} {
			hr := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
			if key != "" {
				hr.Header.Set("Idempotency-Key", key)
			}
			w := httptest.NewRecorder()
			r.ServeHTTP(w, hr)
			assert.Equal(t, want, w.Code, "POST %s key=%q: gin's answer; body %q", path, key, w.Body.String())
			assert.Empty(t, w.Header().Get(core.ReplayedHeader), "POST %s key=%q: replayed", path, key)
		}
	}
	assert.Zero(t, store.Len(), "records after requests to unknown routes")
	// A known route is still protected.
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/orders/1", strings.NewReader("{}")))
	assert.Equal(t, http.StatusBadRequest, w.Code, "known route without a key: 400 missing-key")
}

// TestUnmatchedRoutes: installed with r.Use, idem also sees requests gin
// answers itself (404, 405); they pass through untouched: gin's usual
// answer, byte for byte, never a replay (issue 19: nothing is recorded for
// a route that does not exist; TestGlobalMiddlewareLeavesUnknownRoutesAlone
// checks the store).
func TestUnmatchedRoutes(t *testing.T) {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(mw(newEngine(t)))
	r.POST("/v1/payments", func(c *gin.Context) { c.Status(http.StatusCreated) })

	bare := gin.New()
	bare.HandleMethodNotAllowed = true
	bare.POST("/v1/payments", func(c *gin.Context) { c.Status(http.StatusCreated) })

	for i, tc := range []struct{ method, path string }{
		{http.MethodPost, "/v1/nope"},
		{http.MethodPatch, "/v1/payments"},
	} {
		key := fmt.Sprint("u", i)
		want := serve(bare, req{Method: tc.method, Path: tc.path, Body: payBody})
		for range 2 {
			got := serve(r, req{Method: tc.method, Path: tc.path, Key: key, Body: payBody})
			assert.Equal(t, want.Status, got.Status, "%s %s: status with idem, gin alone", tc.method, tc.path)
			assert.Equal(t, string(want.Body), string(got.Body), "%s %s: body with idem, gin alone", tc.method, tc.path)
			assert.Empty(t, got.Header.Get(core.ReplayedHeader), "%s %s: replayed", tc.method, tc.path)
			for _, h := range []string{"Content-Type", "Allow"} {
				assert.Equal(t, want.Header.Get(h), got.Header.Get(h), "%s %s: %s with idem, gin alone", tc.method, tc.path, h)
			}
		}
	}
}
