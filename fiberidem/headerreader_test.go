package fiberidem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
)

// TestEngineReadsHeaders covers the headers the engine reads through
// fiberidem's header reader rather than a copied http.Header: a
// core.WithScope function reading any request header, and
// WithFingerprintHeaders, with fasthttp's header normalising on and off.
func TestEngineReadsHeaders(t *testing.T) {
	for _, raw := range []bool{false, true} {
		name := "normalised"
		if raw {
			name = "not-normalised"
		}
		t.Run(name, func(t *testing.T) {
			eng := newEngine(t, nil,
				core.WithScope(func(_ context.Context, r *core.Request) (string, error) {
					if s := r.Header.Get("X-Tenant"); s != "" {
						return s, nil
					}
					return "", errors.New("no tenant")
				}),
				core.WithFingerprintHeaders("X-Amount-Currency"))
			app := newApp(fiber.Config{DisableHeaderNormalizing: raw})
			runs := 0
			app.Post("/pay", mw(t, eng), func(c *fiber.Ctx) error {
				runs++
				return c.Status(fiber.StatusCreated).SendString("ok")
			})
			// Lower-case names: as sent when fasthttp does not normalise.
			send := func(tenant, currency string) int {
				req, err := http.NewRequest("POST", "/pay", strings.NewReader("{}"))
				require.NoError(t, err)
				req.Header["idempotency-key"] = []string{"k1"}
				req.Header["x-amount-currency"] = []string{currency}
				if tenant != "" {
					req.Header["x-tenant"] = []string{tenant}
				}
				resp, err := app.Test(req, -1)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				return resp.StatusCode
			}
			assert.Equal(t, http.StatusUnauthorized, send("", "JPY"), "no tenant")
			assert.Equal(t, http.StatusCreated, send("a", "JPY"), "tenant a")
			assert.Equal(t, http.StatusCreated, send("b", "JPY"), "tenant b, same key: its own execution")
			assert.Equal(t, 2, runs, "runs after tenant b, same key: its own execution")
			assert.Equal(t, http.StatusUnprocessableEntity, send("a", "USD"), "tenant a, other fingerprint header")
			assert.Equal(t, http.StatusCreated, send("a", "JPY"), "tenant a retry: a replay")
			assert.Equal(t, 2, runs, "runs after tenant a retry: a replay")
		})
	}
}
