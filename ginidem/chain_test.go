package ginidem_test

import (
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
)

// TestWriterSemantics: inside the chain, c.Writer behaves as gin's own
// writer does (lazy status, Size -1 until written, Written).
func TestWriterSemantics(t *testing.T) {
	probe := func(trace *[]string) gin.HandlerFunc {
		return func(c *gin.Context) {
			w := c.Writer
			note := func(step string) {
				*trace = append(*trace, fmt.Sprintf("%s:%d/%d/%t", step, w.Status(), w.Size(), w.Written()))
			}
			note("start")
			c.Status(http.StatusAccepted)
			note("status")
			c.Status(http.StatusCreated) // last one wins before the header is committed
			note("status2")
			w.WriteHeaderNow()
			note("now")
			c.Status(http.StatusTeapot) // ignored once committed
			note("late")
			_, _ = w.WriteString("abc")
			_, _ = w.Write([]byte("de"))
			note("body")
		}
	}
	var bare, wrapped []string
	r := gin.New()
	r.POST("/bare", probe(&bare))
	r.POST("/idem", mw(newEngine(t)), probe(&wrapped))
	b := serve(r, req{Path: "/bare", Body: payBody})
	w := serve(r, req{Path: "/idem", Key: "w", Body: payBody})
	assert.Equal(t, bare, wrapped, "writer state: bare gin, then with idem")
	assert.Equal(t, b.Status, w.Status, "status: bare gin, then with idem")
	assert.Equal(t, string(b.Body), string(w.Body), "body: bare gin, then with idem")
}

// TestOuterMiddlewareView: middleware outside idem gets gin's own writer
// back, sees the status sent (first and replay), and its request context is
// not the finished lease's.
func TestOuterMiddlewareView(t *testing.T) {
	type seen struct {
		status, size int
		sameWriter   bool
		ctxErr       error
		keyInCtx     bool
	}
	var last seen
	var handlerKey string
	r := gin.New()
	r.Use(func(c *gin.Context) {
		w := c.Writer
		c.Next()
		_, keyInCtx := core.KeyFromContext(c.Request.Context())
		last = seen{c.Writer.Status(), c.Writer.Size(), c.Writer == w, c.Request.Context().Err(), keyInCtx}
	})
	r.POST("/v1/payments", mw(newEngine(t)), func(c *gin.Context) {
		handlerKey, _ = core.KeyFromContext(c.Request.Context())
		c.JSON(http.StatusCreated, gin.H{"ok": true})
	})
	want := seen{status: 201, size: len(`{"ok":true}`), sameWriter: true}
	serve(r, req{Path: "/v1/payments", Key: "o", Body: payBody})
	assert.Equal(t, want, last, "outer middleware after first")
	assert.Equal(t, "o", handlerKey, "core.KeyFromContext in handler")
	serve(r, req{Path: "/v1/payments", Key: "o", Body: payBody})
	assert.Equal(t, want, last, "outer middleware after replay")
}

// TestOuterMiddlewareHeadersKept: headers set by middleware before idem
// (CORS's Vary: Origin, a request ID) are visible to the handler, and what
// it adds to them is added, as without idem; the captured response must not
// replace them, first or replay.
func TestOuterMiddlewareHeadersKept(t *testing.T) {
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Writer.Header().Add("Vary", "Origin")
		c.Header("X-Request-Id", "rid")
		c.Next()
	})
	r.POST("/pay", mw(newEngine(t)), func(c *gin.Context) {
		assert.Equal(t, "rid", c.Writer.Header().Get("X-Request-Id"), "handler sees X-Request-Id")
		c.Writer.Header().Add("Vary", "Accept")
		c.String(http.StatusCreated, "paid")
	})
	for i := range 2 {
		rec := httptest.NewRecorder()
		hr := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		hr.Header.Set("Idempotency-Key", "k")
		r.ServeHTTP(rec, hr)
		require.Equal(t, http.StatusCreated, rec.Code, "request %d", i)
		require.Equal(t, "paid", rec.Body.String(), "request %d", i)
		assert.Equal(t, []string{"Origin", "Accept"}, rec.Header().Values("Vary"), "request %d: Vary as without idem", i)
	}
}

// TestRejectionsAbortChain: missing key (400) and payload mismatch (422)
// are written with gin's writer and nothing after idem runs.
func TestRejectionsAbortChain(t *testing.T) {
	var n atomic.Int64
	r := gin.New()
	r.POST("/v1/payments", mw(newEngine(t)), func(c *gin.Context) {
		n.Add(1)
		c.Status(http.StatusCreated)
	})
	checkProblem(t, serve(r, req{Path: "/v1/payments", Body: payBody}), http.StatusBadRequest, problem.MissingKey)
	checkProblem(t, serve(r, req{Path: "/v1/payments", Key: "bad\x01key", Body: payBody}), http.StatusBadRequest, problem.InvalidKey)
	assert.Zero(t, n.Load(), "handler runs after rejections")
	// Safe methods bypass idem entirely.
	r.GET("/v1/payments", mw(newEngine(t)), func(c *gin.Context) { c.String(http.StatusOK, "list") })
	got := serve(r, req{Method: http.MethodGet, Path: "/v1/payments"})
	assert.Equal(t, http.StatusOK, got.Status, "GET: a bypass")
	assert.Equal(t, "list", string(got.Body), "GET: a bypass")
}

// TestBodyAndRoute: the handler binds the body idem read and sees the route
// template; the same key on another order (same template, other path) or
// with another body is a different request: 422.
func TestBodyAndRoute(t *testing.T) {
	var n atomic.Int64
	r := gin.New()
	r.POST("/v1/orders/:id/confirm", mw(newEngine(t)), func(c *gin.Context) {
		n.Add(1)
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.ShouldBindJSON(&in); err != nil {
			c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		c.JSON(http.StatusOK, gin.H{"order": c.Param("id"), "amount": in.Amount, "route": c.FullPath()})
	})
	first := serve(r, req{Path: "/v1/orders/7/confirm", Key: "b", Body: payBody})
	assert.Equal(t, http.StatusOK, first.Status, "first status")
	assert.Equal(t, `{"amount":1000,"order":"7","route":"/v1/orders/:id/confirm"}`, string(first.Body), "first body")
	mismatch := serve(r, req{Path: "/v1/orders/7/confirm", Key: "b", Body: `{"amount":50000}`})
	checkProblem(t, mismatch, http.StatusUnprocessableEntity, problem.PayloadMismatch)
	other := serve(r, req{Path: "/v1/orders/8/confirm", Key: "b", Body: payBody})
	checkProblem(t, other, http.StatusUnprocessableEntity, problem.PayloadMismatch)
	assert.EqualValues(t, 1, n.Load(), "handler runs")
}
