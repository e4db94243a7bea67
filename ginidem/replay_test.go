package ginidem_test

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNativeReplay runs gin's own response helpers, which write through
// c.Writer in different ways (Render, WriteHeaderNow, lazy status), and
// checks that the replay is the first response byte for byte. Every body
// includes the execution number, so a re-execution cannot pass for a replay.
func TestNativeReplay(t *testing.T) {
	cases := []struct {
		name       string
		handler    func(c *gin.Context, n int64)
		wantStatus int
		wantBody   string
		wantHeader map[string]string // on both responses
		cookie     bool              // first response sets a cookie
	}{
		{
			name:       "JSON",
			handler:    func(c *gin.Context, n int64) { c.JSON(http.StatusCreated, gin.H{"id": n}) },
			wantStatus: 201, wantBody: `{"id":1}`,
			wantHeader: map[string]string{"Content-Type": "application/json; charset=utf-8"},
		},
		{
			name:       "String",
			handler:    func(c *gin.Context, n int64) { c.String(http.StatusOK, "hello %d", n) },
			wantStatus: 200, wantBody: "hello 1",
			wantHeader: map[string]string{"Content-Type": "text/plain; charset=utf-8"},
		},
		{
			name: "Data",
			handler: func(c *gin.Context, n int64) {
				c.Data(http.StatusAccepted, "application/octet-stream", []byte{0, 1, 2, byte(n)})
			},
			wantStatus: 202, wantBody: "\x00\x01\x02\x01",
			wantHeader: map[string]string{"Content-Type": "application/octet-stream"},
		},
		{
			name: "Status204",
			handler: func(c *gin.Context, n int64) {
				c.Header("ETag", fmt.Sprintf(`"v%d"`, n))
				c.Status(http.StatusNoContent)
			},
			wantStatus: 204, wantBody: "",
			wantHeader: map[string]string{"ETag": `"v1"`},
		},
		{
			name: "AbortWithStatusJSON",
			handler: func(c *gin.Context, n int64) {
				c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": "amount must be positive", "n": n})
			},
			wantStatus: 400, wantBody: `{"error":"amount must be positive","n":1}`,
		},
		{
			name:       "AbortWithStatus",
			handler:    func(c *gin.Context, _ int64) { c.AbortWithStatus(http.StatusUnprocessableEntity) },
			wantStatus: 422, wantBody: "",
		},
		{
			name: "AbortWithError",
			handler: func(c *gin.Context, _ int64) {
				_ = c.AbortWithError(http.StatusForbidden, errors.New("not your account"))
			},
			wantStatus: 403, wantBody: "",
		},
		{
			name: "HeaderLocationAndCookie",
			handler: func(c *gin.Context, n int64) {
				c.Header("Location", fmt.Sprintf("/v1/payments/%d", n))
				c.Header("X-Not-Replayed", "1")
				c.SetCookie("session", "s3cret", 3600, "/", "", true, true)
				c.JSON(http.StatusCreated, gin.H{"id": n})
			},
			wantStatus: 201, wantBody: `{"id":1}`,
			wantHeader: map[string]string{"Location": "/v1/payments/1"},
			cookie:     true,
		},
		{
			// gin commits the header lazily: a header set after c.Status
			// but before the first write still goes out.
			name: "HeaderAfterStatus",
			handler: func(c *gin.Context, n int64) {
				c.Status(http.StatusCreated)
				c.Header("Location", fmt.Sprintf("/late/%d", n))
				_, _ = c.Writer.WriteString("created")
			},
			wantStatus: 201, wantBody: "created",
			wantHeader: map[string]string{"Location": "/late/1"},
		},
		{
			name:       "Redirect",
			handler:    func(c *gin.Context, n int64) { c.Redirect(http.StatusSeeOther, fmt.Sprintf("/v1/payments/%d", n)) },
			wantStatus: 303, wantBody: "",
			wantHeader: map[string]string{"Location": "/v1/payments/1"},
		},
		{
			name:       "NothingWritten",
			handler:    func(*gin.Context, int64) {},
			wantStatus: 200, wantBody: "",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			r := gin.New()
			r.POST("/v1/payments", mw(newEngine(t)), func(c *gin.Context) {
				tc.handler(c, n.Add(1))
			})
			first := serve(r, req{Path: "/v1/payments", Key: "k1", Body: payBody})
			replay := serve(r, req{Path: "/v1/payments", Key: "k1", Body: payBody})
			require.EqualValues(t, 1, n.Load(), "handler runs")
			assert.Equal(t, tc.wantStatus, first.Status, "first status")
			assert.Equal(t, tc.wantBody, string(first.Body), "first body")
			for k, v := range tc.wantHeader {
				assert.Equal(t, v, first.Header.Get(k), "first %s", k)
			}
			checkReplay(t, first, replay)
			if tc.cookie {
				assert.True(t, strings.HasPrefix(first.Header.Get("Set-Cookie"), "session=s3cret"),
					"first Set-Cookie = %q, want the session cookie", first.Header.Get("Set-Cookie"))
				assert.Empty(t, replay.Header.Get("X-Not-Replayed"), "replay carries a header outside the allow-list")
			}
		})
	}
}

// TestStreamedNotRetained: a flushed response goes out as written; a retry
// gets the not-retained problem instead of a second execution.
func TestStreamedNotRetained(t *testing.T) {
	var n atomic.Int64
	r := gin.New()
	r.POST("/v1/export", mw(newEngine(t)), func(c *gin.Context) {
		n.Add(1)
		c.Header("Content-Type", "text/event-stream")
		for range 2 {
			_, _ = c.Writer.WriteString("chunk;")
			c.Writer.Flush()
		}
	})
	first := serve(r, req{Path: "/v1/export", Key: "x", Body: payBody})
	assert.Equal(t, http.StatusOK, first.Status)
	assert.Equal(t, "chunk;chunk;", string(first.Body))
	assert.Equal(t, "text/event-stream", first.Header.Get("Content-Type"))
	checkProblem(t, serve(r, req{Path: "/v1/export", Key: "x", Body: payBody}), http.StatusConflict, problem.NotRetained)
	assert.EqualValues(t, 1, n.Load(), "handler runs")
}

// TestHijackedConnectionNotReplayed: a hijacked connection (websocket
// upgrade) is never replayed; a retry gets the not-retained problem.
func TestHijackedConnectionNotReplayed(t *testing.T) {
	var n atomic.Int64
	done := make(chan struct{}, 2) // idem has recorded the outcome
	r := gin.New()
	r.Use(func(c *gin.Context) { c.Next(); done <- struct{}{} })
	r.POST("/v1/ws", mw(newEngine(t)), func(c *gin.Context) {
		n.Add(1)
		conn, rw, err := c.Writer.Hijack()
		if !assert.NoError(t, err, "hijack") {
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		_ = rw.Flush()
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	post := func() (int, string) {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err, "dial")
		defer func() { _ = conn.Close() }()
		_, _ = fmt.Fprintf(conn, "POST /v1/ws HTTP/1.1\r\nHost: x\r\nIdempotency-Key: h\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, "read")
		defer func() { _ = res.Body.Close() }()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	s, b := post()
	assert.Equal(t, 200, s, "first status")
	assert.Equal(t, "hijacked", b, "first body")
	// The client had its answer before the handler returned: done, sent
	// once idem has recorded the outcome, is the signal to retry on. The
	// timeout only turns a hang into a failure.
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the first request never finished")
	}
	s, b = post()
	assert.Equal(t, http.StatusConflict, s, "retry status")
	assert.Contains(t, b, problem.NotRetained, "retry body")
	assert.EqualValues(t, 1, n.Load(), "handler runs")
}

// TestWriteBehindCapture: a response written past the capturing writer
// (engine.HandleContext resets c.Writer to gin's own) went out unrecorded;
// it is recorded as not retained, never as an empty 200, and not re-run.
func TestWriteBehindCapture(t *testing.T) {
	var n atomic.Int64
	r := gin.New()
	r.POST("/v1/old", mw(newEngine(t)), func(c *gin.Context) {
		n.Add(1)
		c.Request.URL.Path = "/v1/new"
		r.HandleContext(c)
	})
	r.POST("/v1/new", func(c *gin.Context) { c.String(http.StatusCreated, "new") })
	first := serve(r, req{Path: "/v1/old", Key: "hc", Body: payBody})
	assert.Equal(t, http.StatusCreated, first.Status, "first: the re-routed handler's answer")
	assert.Equal(t, "new", string(first.Body), "first: the re-routed handler's answer")
	checkProblem(t, serve(r, req{Path: "/v1/old", Key: "hc", Body: payBody}), http.StatusConflict, problem.NotRetained)
	assert.EqualValues(t, 1, n.Load(), "handler runs")
}
