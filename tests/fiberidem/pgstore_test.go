package fiberidem_test

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// TestPostgresTransactionalMode: the lease reaches a native Fiber handler
// through c.UserContext(), so pgstore.Tx gives it the business transaction;
// a stored 201 commits the write with the response, and an error returned
// by the handler (rendered 500 by the app's error handler, retryable) rolls
// it back.
func TestPostgresTransactionalMode(t *testing.T) {
	store, schema := pgstores.Store(t)
	ident, count := pgstores.Ledger(t, store, schema)

	var runs atomic.Int32
	app := newApp()
	app.Post("/v1/payments", mw(newEngine(t, store)), func(c *fiber.Ctx) error {
		n := runs.Add(1)
		tx, err := pgstore.Tx(c.UserContext())
		if err != nil {
			return err
		}
		if _, err := tx.Exec(c.UserContext(), "INSERT INTO "+ident+" (note) VALUES ($1)", c.Get("X-Note")); err != nil {
			return err
		}
		if n == 1 {
			return errors.New("provider down") // 500: rolled back, retryable
		}
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"run": n})
	})
	url := serve(t, app) + "/v1/payments"
	cl := client(t, 0)
	send := func() result {
		return mustDo(t, cl, "POST", url, `{"amount":1}`, "Idempotency-Key", "k", "X-Note", "a")
	}

	if r := send(); r.Status != 500 {
		t.Fatalf("first: %d %s", r.Status, r.Body)
	}
	if n := count(); n != 0 {
		t.Fatalf("failed run left %d rows", n)
	}
	first := send()
	if first.Status != 201 || first.Body != `{"run":2}` {
		t.Fatalf("retry: %d %s", first.Status, first.Body)
	}
	sameResponse(t, first, send())
	if n := count(); n != 1 || runs.Load() != 2 {
		t.Errorf("rows %d, runs %d; want 1 row, 2 runs", n, runs.Load())
	}
}
