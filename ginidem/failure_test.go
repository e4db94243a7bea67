package ginidem_test

import (
	"errors"
	"github.com/idemkit/idem/core/problem"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestPanicAnswers500AndReleasesKey: a panicking handler answers a 500
// problem, is not re-raised to gin.Recovery, stops the chain, and leaves the
// key retryable.
func TestPanicAnswers500AndReleasesKey(t *testing.T) {
	var n, after, recovered atomic.Int64
	var outerErrors atomic.Int64
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) {
		recovered.Add(1)
		c.AbortWithStatus(http.StatusTeapot)
	}))
	r.Use(func(c *gin.Context) {
		c.Next()
		outerErrors.Store(int64(len(c.Errors)))
	})
	r.POST("/v1/payments", mw(newEngine(t)), func(c *gin.Context) {
		if n.Add(1) == 1 {
			c.Header("Set-Cookie", "leak=1")
			c.Status(http.StatusCreated)
			panic("provider client exploded")
		}
		c.JSON(http.StatusCreated, gin.H{"id": n.Load()})
	}, func(*gin.Context) { after.Add(1) })

	first := serve(r, req{Path: "/v1/payments", Key: "p", Body: payBody})
	checkProblem(t, first, http.StatusInternalServerError, problem.HandlerPanic)
	assert.Empty(t, first.Header.Get("Set-Cookie"), "the panicking handler's headers leaked: %v", first.Header)
	assert.Zero(t, recovered.Load(), "gin.Recovery saw the panic; the middleware must have answered it")
	assert.Zero(t, after.Load(), "the handler after the panicking one ran")
	assert.EqualValues(t, 1, outerErrors.Load(), "errors the outer middleware saw in c.Errors: want the panic")

	retry := serve(r, req{Path: "/v1/payments", Key: "p", Body: payBody})
	require.Equal(t, http.StatusCreated, retry.Status, "retry: want 201 from a second run; body %q", retry.Body)
	require.EqualValues(t, 2, n.Load(), "handler runs")
	checkReplay(t, retry, serve(r, req{Path: "/v1/payments", Key: "p", Body: payBody}))
}

// TestPanicAfterFlushAbortsConnection: once part of the response went out,
// the panic is re-raised as http.ErrAbortHandler (the connection must be
// dropped); the key is still released.
func TestPanicAfterFlushAbortsConnection(t *testing.T) {
	var n atomic.Int64
	var abortSeen atomic.Bool
	r := gin.New()
	r.Use(func(c *gin.Context) { // outside Recovery: sees what it recorded
		c.Next()
		for _, e := range c.Errors {
			if errors.Is(e.Err, http.ErrAbortHandler) {
				abortSeen.Store(true)
			}
		}
	})
	r.Use(gin.RecoveryWithWriter(io.Discard))
	r.POST("/v1/stream", mw(newEngine(t)), func(c *gin.Context) {
		if n.Add(1) == 1 {
			c.String(http.StatusOK, "partial")
			c.Writer.Flush()
			panic("mid-stream")
		}
		c.String(http.StatusOK, "whole")
	})
	first := serve(r, req{Path: "/v1/stream", Key: "s", Body: payBody})
	assert.Equal(t, "partial", string(first.Body), "first body: the flushed part")
	assert.True(t, abortSeen.Load(), "gin.Recovery did not see http.ErrAbortHandler")
	retry := serve(r, req{Path: "/v1/stream", Key: "s", Body: payBody})
	assert.Equal(t, http.StatusOK, retry.Status, "retry status")
	assert.Equal(t, "whole", string(retry.Body), "retry body: a second run")
	assert.EqualValues(t, 2, n.Load(), "handler runs")
}

// TestHandlerErrorWithoutResponse: a chain that only calls c.Error leaves
// the answer to an error middleware outside idem, and the key retryable.
func TestHandlerErrorWithoutResponse(t *testing.T) {
	var n atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) { // a typical error-rendering middleware
		c.Next()
		if len(c.Errors) > 0 && !c.Writer.Written() {
			c.JSON(http.StatusInternalServerError, gin.H{"error": c.Errors.Last().Error()})
		}
	})
	r.POST("/v1/payments", mw(newEngine(t)), func(c *gin.Context) {
		if n.Add(1) == 1 {
			_ = c.Error(errors.New("provider timeout"))
			return
		}
		c.JSON(http.StatusCreated, gin.H{"id": n.Load()})
	})
	first := serve(r, req{Path: "/v1/payments", Key: "e", Body: payBody})
	assert.Equal(t, http.StatusInternalServerError, first.Status, "first: the error middleware's 500")
	assert.Contains(t, string(first.Body), "provider timeout", "first: the error middleware's 500")
	retry := serve(r, req{Path: "/v1/payments", Key: "e", Body: payBody})
	require.Equal(t, http.StatusCreated, retry.Status, "retry: want 201 from a second run; body %q", retry.Body)
	require.EqualValues(t, 2, n.Load(), "handler runs")
	checkReplay(t, retry, serve(r, req{Path: "/v1/payments", Key: "e", Body: payBody}))
}

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
				hr, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payBody))
				require.NoError(t, err)
				hr.Header.Set("Idempotency-Key", "k")
				tr := &http.Transport{}
				t.Cleanup(tr.CloseIdleConnections)
				res, err := (&http.Client{Transport: tr}).Do(hr)
				if err != nil {
					return // cut before the header
				}
				b, err := io.ReadAll(res.Body)
				_ = res.Body.Close()
				require.Error(t, err, "client got a complete %d %q; want a broken response", res.StatusCode, b)
			})
		}
	}
}
