package fiberidem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"

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
			app.Post("/pay", mw(eng), func(c *fiber.Ctx) error {
				runs++
				return c.Status(fiber.StatusCreated).SendString("ok")
			})
			// Lower-case names: as sent when fasthttp does not normalise.
			send := func(tenant, currency string) int {
				req, err := http.NewRequest("POST", "/pay", strings.NewReader("{}"))
				if err != nil {
					t.Fatal(err)
				}
				req.Header["idempotency-key"] = []string{"k1"}
				req.Header["x-amount-currency"] = []string{currency}
				if tenant != "" {
					req.Header["x-tenant"] = []string{tenant}
				}
				resp, err := app.Test(req, -1)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			if st := send("", "JPY"); st != http.StatusUnauthorized {
				t.Errorf("no tenant: %d, want 401", st)
			}
			if st := send("a", "JPY"); st != http.StatusCreated {
				t.Errorf("tenant a: %d", st)
			}
			if st := send("b", "JPY"); st != http.StatusCreated || runs != 2 {
				t.Errorf("tenant b, same key: %d, runs %d; want its own execution", st, runs)
			}
			if st := send("a", "USD"); st != http.StatusUnprocessableEntity {
				t.Errorf("tenant a, other fingerprint header: %d, want 422", st)
			}
			if st := send("a", "JPY"); st != http.StatusCreated || runs != 2 {
				t.Errorf("tenant a retry: %d, runs %d; want a replay", st, runs)
			}
		})
	}
}
