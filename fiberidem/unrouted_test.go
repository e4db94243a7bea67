package fiberidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberidem"
)

// TestGlobalMiddlewareLeavesUnknownRoutesAlone: mounted with app.Use or
// Group.Use, as fiber teaches, a POST to a path no route matches gets
// fiber's own 404 (405 for a known path with another method), with or
// without a key; nothing is recorded. Known routes stay protected.
func TestGlobalMiddlewareLeavesUnknownRoutesAlone(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	require.NoError(t, err)
	m, err := fiberidem.New(eng)
	require.NoError(t, err)
	ok := func(c *fiber.Ctx) error { return c.Status(http.StatusCreated).SendString("ok") }
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(m)
	app.Post("/v1/orders/:id", ok)
	app.Get("/v1/list", ok)
	g := app.Group("/g")
	g.Use(m)
	g.Post("/orders/:id<int>", ok)

	cases := map[string]int{
		"/nope":         http.StatusNotFound,
		"/v1/orders":    http.StatusNotFound,
		"/v1/list":      http.StatusMethodNotAllowed,
		"/g/nope":       http.StatusNotFound,
		"/g/orders/abc": http.StatusNotFound,
	}
	for _, key := range []string{"", "k-unknown"} {
		for path, want := range cases {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			resp, err := app.Test(req, -1)
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, want, resp.StatusCode, "POST %s key=%q: %q, want fiber's status", path, key, b)
			assert.Empty(t, resp.Header.Get(core.ReplayedHeader), "POST %s key=%q: replayed", path, key)
		}
	}
	assert.Zero(t, store.Len(), "records after requests to unknown routes")
	// As fiber routes them: trailing slash and case ignored by default.
	for _, path := range []string{"/v1/orders/1", "/g/orders/1", "/v1/orders/1/", "/V1/Orders/1", "/g/orders/1//"} {
		resp, err := app.Test(httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}")), -1)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "known route %s without a key: want 400 missing-key", path)
	}
}
