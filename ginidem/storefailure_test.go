package ginidem_test

import (
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/ginidem"
)

// TestStoreDownAnswers503: the default error handler answers the 503
// problem; a custom one gets the error and the fallback. The handler never
// runs.
func TestStoreDownAnswers503(t *testing.T) {
	var n atomic.Int64
	eng := newEngineOn(t, idemtest.FailingStore{Store: memstore.New()})
	var gotErr error
	var gotFallback *adapterkit.Response
	custom := ginidem.WithErrorHandler(func(c *gin.Context, err error, fallback *adapterkit.Response) {
		gotErr, gotFallback = err, fallback
		c.JSON(http.StatusServiceUnavailable, gin.H{"code": "try_later"})
	})
	r := gin.New()
	h := func(c *gin.Context) { n.Add(1); c.Status(http.StatusCreated) }
	r.POST("/default", mw(eng), h)
	r.POST("/custom", mw(eng, custom), h)

	def := serve(r, req{Path: "/default", Key: "d", Body: payBody})
	checkProblem(t, def, http.StatusServiceUnavailable, problem.StoreUnavailable)
	assert.NotEmpty(t, def.Header.Get("Retry-After"), "503 without Retry-After")
	cus := serve(r, req{Path: "/custom", Key: "d", Body: payBody})
	assert.Equal(t, http.StatusServiceUnavailable, cus.Status, "custom status")
	assert.Equal(t, `{"code":"try_later"}`, string(cus.Body), "custom body")
	assert.ErrorIs(t, gotErr, idemtest.ErrStoreDown, "error handler's error")
	if assert.NotNil(t, gotFallback, "error handler's fallback") {
		assert.Equal(t, http.StatusServiceUnavailable, gotFallback.Status, "error handler's fallback")
	}
	assert.Zero(t, n.Load(), "handler runs with the store down")
}

// TestCommitFailureDiscardsResponse: when the outcome cannot be recorded,
// the client gets the commit-error problem, never the handler's
// (unrecorded) response or its headers.
func TestCommitFailureDiscardsResponse(t *testing.T) {
	eng := newEngineOn(t, failCompleteStore{Store: memstore.New()})
	var called atomic.Bool
	r := gin.New()
	r.POST("/default", mw(eng), func(c *gin.Context) {
		c.SetCookie("session", "x", 60, "/", "", true, true)
		c.JSON(http.StatusCreated, gin.H{"charged": true})
	})
	r.POST("/custom", mw(eng, ginidem.WithErrorHandler(func(c *gin.Context, err error, fb *adapterkit.Response) {
		called.Store(errors.Is(err, errCommitDown))
		c.Data(fb.Status, "text/plain", []byte("custom"))
	})), func(c *gin.Context) { c.JSON(http.StatusCreated, gin.H{"charged": true}) })

	got := serve(r, req{Path: "/default", Key: "c", Body: payBody})
	checkProblem(t, got, http.StatusServiceUnavailable, problem.StoreUnavailable)
	assert.Empty(t, got.Header.Get("Set-Cookie"), "the unrecorded response's cookie leaked")
	assert.NotContains(t, string(got.Body), "charged", "the unrecorded response's body leaked")
	got = serve(r, req{Path: "/custom", Key: "c2", Body: payBody})
	assert.Equal(t, http.StatusServiceUnavailable, got.Status, "custom status")
	assert.Equal(t, "custom", string(got.Body), "custom body")
	assert.True(t, called.Load(), "custom error handler called with the commit error")
}

// TestErrorHandlerWritesNothing: an error handler that only logs cannot turn
// a store failure into gin's empty 200; one that sets a status keeps it.
func TestErrorHandlerWritesNothing(t *testing.T) {
	eng := newEngineOn(t, idemtest.FailingStore{Store: memstore.New()})
	var logged atomic.Int64
	r := gin.New()
	h := func(c *gin.Context) { c.Status(http.StatusCreated) }
	r.POST("/log", mw(eng, ginidem.WithErrorHandler(func(*gin.Context, error, *adapterkit.Response) {
		logged.Add(1)
	})), h)
	r.POST("/status", mw(eng, ginidem.WithErrorHandler(func(c *gin.Context, _ error, _ *adapterkit.Response) {
		c.Status(http.StatusBadGateway)
	})), h)
	checkProblem(t, serve(r, req{Path: "/log", Key: "l", Body: payBody}), http.StatusServiceUnavailable, problem.StoreUnavailable)
	assert.EqualValues(t, 1, logged.Load(), "error handler calls")
	got := serve(r, req{Path: "/status", Key: "l", Body: payBody})
	assert.Equal(t, http.StatusBadGateway, got.Status, "status-only error handler: its 502")
	assert.Empty(t, got.Body, "status-only error handler: no body")
}
