package fiberv3idem_test

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/fiberv3idem"
	"github.com/idemkit/idem/fiberv3idem/fiberv3idemtest"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// TestPostgresTransactionalMode: the lease reaches a native Fiber v3
// handler through c.Context(), so pgstore.Tx gives it the business
// transaction; a stored 201 commits the write with the response, and an
// error returned by the handler (rendered 500 by the app's error handler,
// retryable) rolls it back.
func TestPostgresTransactionalMode(t *testing.T) {
	store, schema := pgstores.Store(t)
	ident, count := pgstores.Ledger(t, store, schema)
	eng, err := core.New(store, core.WithSharedKeySpace())
	require.NoError(t, err, "core.New")
	mw, err := fiberv3idem.New(eng)
	require.NoError(t, err, "fiberv3idem.New")

	var runs atomic.Int32
	app := fiberv3idemtest.NewApp()
	app.Post("/v1/payments", mw, func(c fiber.Ctx) error {
		n := runs.Add(1)
		tx, err := pgstore.Tx(c.Context())
		if err != nil {
			return err
		}
		if _, err := tx.Exec(c.Context(), "INSERT INTO "+ident+" (note) VALUES ($1)", c.Get("X-Note")); err != nil {
			return err
		}
		if n == 1 {
			return errors.New("provider down") // 500: rolled back, retryable
		}
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"run": n})
	})
	url := fiberv3idemtest.Serve(t, app) + "/v1/payments"
	cl := fiberv3idemtest.Client(t, 0)
	send := func() fiberv3idemtest.Result {
		t.Helper()
		r, err := fiberv3idemtest.Do(cl, "POST", url, `{"amount":1}`, "Idempotency-Key", "k", "X-Note", "a")
		require.NoError(t, err, "POST %s", url)
		return r
	}

	r := send()
	require.Equal(t, 500, r.Status, "first: %s", r.Body)
	require.Zero(t, count(), "rows left by the failed run")
	first := send()
	require.Equal(t, 201, first.Status, "retry: %s", first.Body)
	require.Equal(t, `{"run":2}`, first.Body, "retry")
	fiberv3idemtest.SameResponse(t, first, send())
	assert.Equal(t, 1, count(), "rows")
	assert.EqualValues(t, 2, runs.Load(), "handler runs")
}
