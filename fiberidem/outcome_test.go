package fiberidem_test

import (
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestDiscardDropsHijack: a handler that hijacked the connection with
// fasthttp (its hijack handler runs once the chain returned, here writing
// its own 201) and then failed (its outcome could not be recorded, or it
// panicked) must not reach the client through that hijack: idem answers
// with its problem instead, and the record is not completed.
func TestDiscardDropsHijack(t *testing.T) {
	hijack := func(c *fiber.Ctx) {
		c.Context().HijackSetNoResponse(true)
		c.Context().Hijack(func(conn net.Conn) {
			_, _ = conn.Write([]byte("HTTP/1.1 201 Created\r\nContent-Length: 7\r\nConnection: close\r\n\r\ncharged"))
		})
	}
	cases := []struct {
		name    string
		store   core.Store
		handler fiber.Handler
		status  int
	}{
		{"commit_fails", &failingStore{Store: memstore.New(), complete: errors.New("db down at commit")},
			func(c *fiber.Ctx) error { hijack(c); return nil }, http.StatusServiceUnavailable},
		{"panic", memstore.New(), func(c *fiber.Ctx) error { hijack(c); panic("ledger down") }, http.StatusInternalServerError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			app := newApp()
			app.Use(recover.New())
			app.Post("/pay", mw(t, newEngine(t, tc.store)), tc.handler)
			r, err := do(client(t, 0), "POST", serve(t, app)+"/pay", "{}", "Idempotency-Key", "h1")
			require.NoError(t, err, "POST")
			assert.Equal(t, tc.status, r.Status, "client got %q; want idem's problem", r.Body)
			assert.NotEqual(t, "charged", r.Body, "the hijacked response reached the client")
		})
	}
}
