package fiberidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"

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
	if err != nil {
		t.Fatal(err)
	}
	mw, err := fiberidem.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	ok := func(c *fiber.Ctx) error { return c.Status(http.StatusCreated).SendString("ok") }
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(mw)
	app.Post("/v1/orders/:id", ok)
	app.Get("/v1/list", ok)
	g := app.Group("/g")
	g.Use(mw)
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
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want || resp.Header.Get(core.ReplayedHeader) != "" {
				t.Errorf("POST %s key=%q: %d %q, want fiber's %d", path, key, resp.StatusCode, b, want)
			}
		}
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d records after requests to unknown routes, want 0", n)
	}
	// As fiber routes them: trailing slash and case ignored by default.
	for _, path := range []string{"/v1/orders/1", "/g/orders/1", "/v1/orders/1/", "/V1/Orders/1", "/g/orders/1//"} {
		resp, err := app.Test(httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}")), -1)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("known route %s without a key: %d, want 400 missing-key", path, resp.StatusCode)
		}
	}
}
