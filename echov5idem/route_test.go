package echov5idem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
)

// TestRouteTemplateIsCanonical: the route recorded is echo's registered
// path in idem's canonical form, the one every adapter records for the
// same route, not the request path.
func TestRouteTemplateIsCanonical(t *testing.T) {
	cases := []struct{ register, target, want string }{
		{"/v1/orders/:id/confirm", "/v1/orders/7/confirm", "/v1/orders/{id}/confirm"},
		{"/files/*", "/files/a/b", "/files/{*}"},
		{"/v1/things\\:batch", "/v1/things:batch", "/v1/things\\:batch"},
	}
	for _, tc := range cases {
		t.Run(tc.register, func(t *testing.T) {
			eng, store := newEngine(t)
			e := echo.New()
			e.Use(mw(t, eng))
			e.POST(tc.register, func(c *echo.Context) error { return c.NoContent(http.StatusCreated) })
			w := serve(e, http.MethodPost, tc.target, "k", strings.NewReader("{}"))
			require.Equal(t, http.StatusCreated, w.Code, "POST %s; body %q", tc.target, w.Body.String())
			rec, err := store.Get(t.Context(), "", "k")
			require.NoError(t, err)
			assert.Equal(t, tc.want, rec.Route, "recorded route")
		})
	}
}

// TestLeaseInHandlerContext: the handler's request context carries the
// key (and the lease); outer middleware gets its own request back.
func TestLeaseInHandlerContext(t *testing.T) {
	eng, _ := newEngine(t)
	e := echo.New()
	var inner, outer string
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			err := next(c)
			outer, _ = core.KeyFromContext(c.Request().Context())
			return err
		}
	}, mw(t, eng))
	e.POST("/v1/payments", func(c *echo.Context) error {
		inner, _ = core.KeyFromContext(c.Request().Context())
		return c.NoContent(http.StatusCreated)
	})
	w := serve(e, http.MethodPost, "/v1/payments", "k-ctx", strings.NewReader("{}"))
	require.Equal(t, http.StatusCreated, w.Code, "body %q", w.Body.String())
	assert.Equal(t, "k-ctx", inner, "key in the handler")
	assert.Empty(t, outer, "key in outer middleware")
}
