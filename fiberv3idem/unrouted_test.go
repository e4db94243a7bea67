package fiberv3idem_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberv3idem"
)

// TestGlobalMiddlewareLeavesUnknownRoutesAlone: mounted with app.Use or
// Group.Use, as fiber teaches, a POST to a path no route matches gets
// fiber's own 404 (405 for a known path with another method), with or
// without a key; nothing is recorded. Known routes stay protected.
func TestGlobalMiddlewareLeavesUnknownRoutesAlone(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	require.NoError(t, err)
	m, err := fiberv3idem.New(eng)
	require.NoError(t, err)
	ok := func(c fiber.Ctx) error { return c.Status(http.StatusCreated).SendString("ok") }
	app := fiber.New()
	app.Use(m)
	app.Post("/v1/orders/:id", ok)
	app.Get("/v1/list", ok)
	g := app.Group("/g")
	g.Use(m)
	g.Post("/orders/:id<int>", ok)

	cases := map[string]int{
		"/":             http.StatusNotFound, // the app.Use prefix itself
		"/nope":         http.StatusNotFound,
		"/v1/orders":    http.StatusNotFound,
		"/v1/list":      http.StatusMethodNotAllowed,
		"/g":            http.StatusNotFound, // the Group.Use prefix itself
		"/g/nope":       http.StatusNotFound,
		"/g/orders/abc": http.StatusNotFound,
	}
	for _, key := range []string{"", "k-unknown"} {
		for path, want := range cases {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			status, header, body := test(t, app, req)
			assert.Equal(t, want, status, "POST %s key=%q: %q, want fiber's status", path, key, body)
			assert.Empty(t, header.Get(core.ReplayedHeader), "POST %s key=%q: replayed", path, key)
		}
	}
	assert.Zero(t, store.Len(), "records after requests to unknown routes")
	// As fiber routes them: trailing slash and case ignored by default.
	for _, path := range []string{"/v1/orders/1", "/g/orders/1", "/v1/orders/1/", "/V1/Orders/1", "/g/orders/1//"} {
		status, _, body := test(t, app, httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}")))
		assert.Equal(t, http.StatusBadRequest, status, "known route %s without a key: want 400 missing-key, got %q", path, body)
	}
}

// TestUseMountedRoutes: registered with app.Use or Group.Use, idem runs
// before fiber reaches the route, so the fingerprint uses the request
// path: one key on two endpoints is refused instead of replaying the
// wrong one.
func TestUseMountedRoutes(t *testing.T) {
	store := memstore.New()
	app := newApp()
	v1 := app.Group("/v1")
	v1.Use(mw(t, newEngine(t, store)))
	v1.Post("/payments", func(c fiber.Ctx) error { return c.Status(201).SendString("payment") })
	v1.Post("/refunds", func(c fiber.Ctx) error { return c.Status(201).SendString("refund") })
	base := serve(t, app)
	cl := client(t, 0)
	r := mustDo(t, cl, "POST", base+"/v1/payments", "{}", "Idempotency-Key", "u1")
	require.Equal(t, 201, r.Status, "payments: %q", r.Body)
	require.Equal(t, "payment", r.Body, "payments")
	r = mustDo(t, cl, "POST", base+"/v1/refunds", "{}", "Idempotency-Key", "u1")
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "same key on another route: %q", r.Body)
	rec, err := store.Get(t.Context(), "", "u1")
	require.NoError(t, err, "record")
	require.Equal(t, "/v1/payments", rec.Route, "record route")
}
