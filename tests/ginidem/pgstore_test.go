package ginidem_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/ginidem/ginidemtest"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// TestPostgresTransactionalMode: the lease reaches a gin handler through
// c.Request.Context(), so pgstore.Tx gives it the business transaction. A
// handler error (c.Error only) and a panic roll the write back and leave the
// key retryable; a stored 201 commits the write together with the response.
func TestPostgresTransactionalMode(t *testing.T) {
	store, schema := pgstores.Store(t)
	table, count := pgstores.Ledger(t, store, schema)
	eng, err := core.New(store, core.WithSharedKeySpace())
	require.NoError(t, err, "core.New")
	mw, err := ginidem.New(eng)
	require.NoError(t, err, "ginidem.New")
	var runs atomic.Int32
	r := gin.New()
	r.Use(func(c *gin.Context) { // error rendering outside idem
		c.Next()
		if len(c.Errors) > 0 && !c.Writer.Written() {
			c.JSON(http.StatusBadGateway, gin.H{"error": c.Errors.Last().Error()})
		}
	})
	r.POST("/v1/payments", mw, func(c *gin.Context) {
		n := runs.Add(1)
		tx, err := pgstore.Tx(c.Request.Context())
		if err != nil {
			_ = c.Error(err)
			return
		}
		if _, err := tx.Exec(c.Request.Context(), "INSERT INTO "+table+" (note) VALUES ($1)", c.GetHeader("X-Note")); err != nil {
			_ = c.Error(err)
			return
		}
		switch n {
		case 1:
			_ = c.Error(errors.New("provider down"))
		case 2:
			panic("provider client exploded")
		default:
			c.JSON(http.StatusCreated, gin.H{"run": n})
		}
	})
	call := func() *ginidemtest.Response {
		return ginidemtest.Do(r, ginidemtest.Request{Path: "/v1/payments", Key: "tx", Body: `{"amount":1000,"currency":"JPY","to":"alice"}`, Header: map[string]string{"X-Note": "a"}})
	}

	got := call()
	require.Equal(t, http.StatusBadGateway, got.Status, "first (handler error); body %q", got.Body)
	require.Zero(t, count(), "rows the handler error left")
	got = call()
	require.Equal(t, http.StatusInternalServerError, got.Status, "second (panic); body %q", got.Body)
	require.Zero(t, count(), "rows the panic left")
	first := call()
	require.Equal(t, http.StatusCreated, first.Status, "third; body %q", first.Body)
	require.Equal(t, `{"run":3}`, string(first.Body), "third")
	ginidemtest.SameResponse(t, first, call())
	assert.Equal(t, 1, count(), "rows")
	assert.EqualValues(t, 3, runs.Load(), "handler runs")
}
