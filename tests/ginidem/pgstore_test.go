package ginidem_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

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
	var runs atomic.Int32
	r := gin.New()
	r.Use(func(c *gin.Context) { // error rendering outside idem
		c.Next()
		if len(c.Errors) > 0 && !c.Writer.Written() {
			c.JSON(http.StatusBadGateway, gin.H{"error": c.Errors.Last().Error()})
		}
	})
	r.POST("/v1/payments", mw(newEngineOn(t, store)), func(c *gin.Context) {
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
	call := func() *response {
		return serve(r, req{path: "/v1/payments", key: "tx", body: payBody, header: map[string]string{"X-Note": "a"}})
	}

	if got := call(); got.status != http.StatusBadGateway {
		t.Fatalf("first (handler error) = %d %q", got.status, got.body)
	}
	if n := count(); n != 0 {
		t.Fatalf("handler error left %d rows", n)
	}
	if got := call(); got.status != http.StatusInternalServerError {
		t.Fatalf("second (panic) = %d %q", got.status, got.body)
	}
	if n := count(); n != 0 {
		t.Fatalf("panic left %d rows", n)
	}
	first := call()
	if first.status != http.StatusCreated || string(first.body) != `{"run":3}` {
		t.Fatalf("third = %d %q", first.status, first.body)
	}
	checkReplay(t, first, call())
	if n := count(); n != 1 || runs.Load() != 3 {
		t.Errorf("rows %d, runs %d; want 1 row, 3 runs", n, runs.Load())
	}
}
