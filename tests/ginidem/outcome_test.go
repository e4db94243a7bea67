package ginidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestCutResponsesStayCut: when idem must end a response broken (part of
// it went out and the handler then panicked or its outcome could not be
// recorded, or the handler panicked with http.ErrAbortHandler), the client
// never receives it complete, with or without gin's Recovery, which
// swallows http.ErrAbortHandler as a broken pipe and lets net/http end the
// response cleanly: a complete 2xx for a key that was released or left
// unrecorded, which a retry runs again.
func TestCutResponsesStayCut(t *testing.T) {
	flushed := func(c *gin.Context) {
		c.Status(http.StatusCreated)
		_, _ = c.Writer.WriteString(`{"id":"pay_1",`)
		c.Writer.Flush()
		_, _ = c.Writer.WriteString(`"status":"charged"}`)
	}
	newMem := func() core.Store { return memstore.New() }
	cases := []struct {
		name    string
		store   func() core.Store
		handler gin.HandlerFunc
	}{
		{"flushed_commit_fails", func() core.Store { return failCompleteStore{Store: memstore.New()} }, flushed},
		{"flushed_then_panic", newMem, func(c *gin.Context) { flushed(c); panic("ledger down") }},
		{"abort_handler_panic", newMem, func(*gin.Context) { panic(http.ErrAbortHandler) }},
	}
	for _, tc := range cases {
		for _, recovery := range []bool{false, true} {
			t.Run(tc.name+map[bool]string{false: "/bare", true: "/recovery"}[recovery], func(t *testing.T) {
				r := gin.New()
				if recovery {
					r.Use(gin.RecoveryWithWriter(io.Discard))
				}
				r.POST("/pay", mw(newEngineOn(t, tc.store())), tc.handler)
				srv := httptest.NewServer(r)
				t.Cleanup(srv.Close)
				hr, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payBody))
				hr.Header.Set("Idempotency-Key", "k")
				tr := &http.Transport{}
				t.Cleanup(tr.CloseIdleConnections)
				res, err := (&http.Client{Transport: tr}).Do(hr)
				if err != nil {
					return // cut before the header
				}
				b, err := io.ReadAll(res.Body)
				_ = res.Body.Close()
				if err == nil {
					t.Fatalf("client got a complete %d %q; want a broken response", res.StatusCode, b)
				}
			})
		}
	}
}
