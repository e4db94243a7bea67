package echoidem_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/echoidem/echoidemtest"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// TestPostgresTransactionalMode: the lease reaches an Echo handler through
// c.Request().Context(), so pgstore.Tx gives it the business transaction;
// a stored 201 commits the write with the response, and an error returned
// by the handler (rendered 500, retryable) rolls it back.
func TestPostgresTransactionalMode(t *testing.T) {
	store, schema := pgstores.Store(t)
	table, count := pgstores.Ledger(t, store, schema)
	s := echoidemtest.NewServer(t, store)
	mw, err := echoidem.New(s.Eng)
	require.NoError(t, err, "echoidem.New")
	var runs atomic.Int32
	s.E.POST("/v1/payments", func(c echo.Context) error {
		n := runs.Add(1)
		tx, err := pgstore.Tx(c.Request().Context())
		if err != nil {
			return err
		}
		if _, err := tx.Exec(c.Request().Context(), "INSERT INTO "+table+" (note) VALUES ($1)", c.Request().Header.Get("X-Note")); err != nil {
			return err
		}
		if n == 1 {
			return errors.New("provider down") // 500: rolled back, retryable
		}
		return c.JSON(http.StatusCreated, map[string]int32{"run": n})
	}, mw)
	s.Start()

	r := s.Do("POST", "/v1/payments", "k", `{"amount":1}`, "X-Note", "a")
	require.Equal(t, http.StatusInternalServerError, r.Status, "first: %v", r)
	require.Zero(t, count(), "rows the failed run left")
	first := s.Do("POST", "/v1/payments", "k", `{"amount":1}`, "X-Note", "a")
	require.Equal(t, http.StatusCreated, first.Status, "retry: %v", first)
	echoidemtest.SameResponse(t, first, s.Do("POST", "/v1/payments", "k", `{"amount":1}`, "X-Note", "a"))
	assert.Equal(t, 1, count(), "rows")
	assert.EqualValues(t, 2, runs.Load(), "handler runs")
}
