package ginidem_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/ginidem"
)

const payBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

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
			first := serve(r, req{path: "/v1/payments", key: "k1", body: payBody})
			replay := serve(r, req{path: "/v1/payments", key: "k1", body: payBody})
			if got := n.Load(); got != 1 {
				t.Fatalf("handler ran %d times, want 1", got)
			}
			if first.status != tc.wantStatus || string(first.body) != tc.wantBody {
				t.Errorf("first = %d %q, want %d %q", first.status, first.body, tc.wantStatus, tc.wantBody)
			}
			for k, v := range tc.wantHeader {
				if got := first.header.Get(k); got != v {
					t.Errorf("first %s = %q, want %q", k, got, v)
				}
			}
			checkReplay(t, first, replay)
			if got := first.header.Get("Set-Cookie"); tc.cookie && !strings.HasPrefix(got, "session=s3cret") {
				t.Errorf("first Set-Cookie = %q, want the session cookie", got)
			}
			if tc.cookie && replay.header.Get("X-Not-Replayed") != "" {
				t.Errorf("replay carries a header outside the allow-list")
			}
		})
	}
}

// TestConcurrentDuplicates: 100 simultaneous duplicates run the handler
// once; the other 99 get 409 while it is in flight.
func TestConcurrentDuplicates(t *testing.T) {
	const total = 100
	var n atomic.Int64
	release := make(chan struct{})
	r := gin.New()
	r.POST("/v1/payments", mw(newEngine(t)), func(c *gin.Context) {
		i := n.Add(1)
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		c.JSON(http.StatusCreated, gin.H{"id": i})
	})
	statuses := make(chan int, total)
	start := make(chan struct{})
	for range total {
		go func() {
			<-start
			res := serve(r, req{path: "/v1/payments", key: "dup", body: payBody})
			if res.status == http.StatusConflict {
				if res.header.Get("Retry-After") == "" {
					t.Errorf("409 without Retry-After")
				}
				if !strings.Contains(string(res.body), core.ProblemInFlight) {
					t.Errorf("409 body %q is not the in-flight problem", res.body)
				}
			}
			statuses <- res.status
		}()
	}
	close(start)
	got := map[int]int{}
	timeout := time.After(20 * time.Second)
	for i := range total {
		if i == total-1 {
			close(release) // every duplicate has answered; let the owner finish
		}
		select {
		case s := <-statuses:
			got[s]++
		case <-timeout:
			t.Fatalf("timed out after %d responses: %v", i, got)
		}
	}
	if got[http.StatusCreated] != 1 || got[http.StatusConflict] != total-1 {
		t.Errorf("statuses = %v, want one 201 and %d 409", got, total-1)
	}
	if c := n.Load(); c != 1 {
		t.Errorf("handler ran %d times, want 1", c)
	}
	replay := serve(r, req{path: "/v1/payments", key: "dup", body: payBody})
	if replay.status != http.StatusCreated || replay.header.Get(core.ReplayedHeader) != "true" {
		t.Errorf("after the burst: %d %q, want a replayed 201", replay.status, replay.body)
	}
}

// TestPanic: a panicking handler answers a 500 problem, is not re-raised to
// gin.Recovery, stops the chain, and leaves the key retryable.
func TestPanic(t *testing.T) {
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

	first := serve(r, req{path: "/v1/payments", key: "p", body: payBody})
	checkProblem(t, first, http.StatusInternalServerError, core.ProblemHandlerPanic)
	if first.header.Get("Set-Cookie") != "" {
		t.Errorf("the panicking handler's headers leaked: %v", first.header)
	}
	if recovered.Load() != 0 {
		t.Errorf("gin.Recovery saw the panic; the middleware must have answered it")
	}
	if after.Load() != 0 {
		t.Errorf("the handler after the panicking one ran")
	}
	if outerErrors.Load() != 1 {
		t.Errorf("outer middleware saw %d errors in c.Errors, want the panic", outerErrors.Load())
	}

	retry := serve(r, req{path: "/v1/payments", key: "p", body: payBody})
	if retry.status != http.StatusCreated || n.Load() != 2 {
		t.Fatalf("retry = %d %q after %d runs, want 201 from a second run", retry.status, retry.body, n.Load())
	}
	checkReplay(t, retry, serve(r, req{path: "/v1/payments", key: "p", body: payBody}))
}

// TestPanicAfterFlush: once part of the response went out, the panic is
// re-raised as http.ErrAbortHandler (the connection must be dropped); the
// key is still released.
func TestPanicAfterFlush(t *testing.T) {
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
	first := serve(r, req{path: "/v1/stream", key: "s", body: payBody})
	if string(first.body) != "partial" {
		t.Errorf("first body = %q, want the flushed part", first.body)
	}
	if !abortSeen.Load() {
		t.Errorf("gin.Recovery did not see http.ErrAbortHandler")
	}
	retry := serve(r, req{path: "/v1/stream", key: "s", body: payBody})
	if retry.status != http.StatusOK || string(retry.body) != "whole" || n.Load() != 2 {
		t.Errorf("retry = %d %q after %d runs, want a second run", retry.status, retry.body, n.Load())
	}
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
	first := serve(r, req{path: "/v1/payments", key: "e", body: payBody})
	if first.status != http.StatusInternalServerError || !strings.Contains(string(first.body), "provider timeout") {
		t.Errorf("first = %d %q, want the error middleware's 500", first.status, first.body)
	}
	retry := serve(r, req{path: "/v1/payments", key: "e", body: payBody})
	if retry.status != http.StatusCreated || n.Load() != 2 {
		t.Fatalf("retry = %d %q after %d runs, want 201 from a second run", retry.status, retry.body, n.Load())
	}
	checkReplay(t, retry, serve(r, req{path: "/v1/payments", key: "e", body: payBody}))
}

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
	b := serve(r, req{path: "/bare", body: payBody})
	w := serve(r, req{path: "/idem", key: "w", body: payBody})
	if strings.Join(bare, " ") != strings.Join(wrapped, " ") {
		t.Errorf("writer state differs:\n bare gin %v\n with idem %v", bare, wrapped)
	}
	if b.status != w.status || string(b.body) != string(w.body) {
		t.Errorf("responses differ: bare %d %q, idem %d %q", b.status, b.body, w.status, w.body)
	}
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
	serve(r, req{path: "/v1/payments", key: "o", body: payBody})
	if last != want {
		t.Errorf("outer middleware after first = %+v, want %+v", last, want)
	}
	if handlerKey != "o" {
		t.Errorf("core.KeyFromContext in handler = %q, want o", handlerKey)
	}
	serve(r, req{path: "/v1/payments", key: "o", body: payBody})
	if last != want {
		t.Errorf("outer middleware after replay = %+v, want %+v", last, want)
	}
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
	first := serve(r, req{path: "/v1/orders/7/confirm", key: "b", body: payBody})
	if first.status != http.StatusOK || string(first.body) != `{"amount":1000,"order":"7","route":"/v1/orders/:id/confirm"}` {
		t.Errorf("first = %d %q", first.status, first.body)
	}
	mismatch := serve(r, req{path: "/v1/orders/7/confirm", key: "b", body: `{"amount":50000}`})
	checkProblem(t, mismatch, http.StatusUnprocessableEntity, core.ProblemPayloadMismatch)
	other := serve(r, req{path: "/v1/orders/8/confirm", key: "b", body: payBody})
	checkProblem(t, other, http.StatusUnprocessableEntity, core.ProblemPayloadMismatch)
	if n.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", n.Load())
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
	checkProblem(t, serve(r, req{path: "/v1/payments", body: payBody}), http.StatusBadRequest, core.ProblemMissingKey)
	checkProblem(t, serve(r, req{path: "/v1/payments", key: "bad\x01key", body: payBody}), http.StatusBadRequest, core.ProblemInvalidKey)
	if n.Load() != 0 {
		t.Errorf("handler ran %d times after rejections", n.Load())
	}
	// Safe methods bypass idem entirely.
	r.GET("/v1/payments", mw(newEngine(t)), func(c *gin.Context) { c.String(http.StatusOK, "list") })
	if got := serve(r, req{method: http.MethodGet, path: "/v1/payments"}); got.status != 200 || string(got.body) != "list" {
		t.Errorf("GET = %d %q, want a bypass", got.status, got.body)
	}
}

// TestScope: the scope comes from an auth middleware's context value; the
// same key from two users runs twice; no user answers 401.
func TestScope(t *testing.T) {
	var n atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) { // demo auth
		if u := c.GetHeader("X-User-ID"); u != "" {
			c.Set("user", u)
		}
	})
	mw := mw(newEngine(t), ginidem.WithScope(func(c *gin.Context) (string, error) {
		u := c.GetString("user")
		if u == "" {
			return "", errors.New("unauthenticated")
		}
		return u, nil
	}))
	r.POST("/v1/payments", mw, func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"id": n.Add(1), "user": c.GetString("user")})
	})
	alice := serve(r, req{path: "/v1/payments", key: "same", body: payBody, header: map[string]string{"X-User-ID": "alice"}})
	bob := serve(r, req{path: "/v1/payments", key: "same", body: payBody, header: map[string]string{"X-User-ID": "bob"}})
	if alice.status != 201 || bob.status != 201 || n.Load() != 2 {
		t.Errorf("alice %d, bob %d, runs %d: want two executions", alice.status, bob.status, n.Load())
	}
	checkReplay(t, alice, serve(r, req{path: "/v1/payments", key: "same", body: payBody, header: map[string]string{"X-User-ID": "alice"}}))
	checkProblem(t, serve(r, req{path: "/v1/payments", key: "same", body: payBody}), http.StatusUnauthorized, core.ProblemScopeUnavailable)
	if n.Load() != 2 {
		t.Errorf("handler ran without a scope")
	}
}

// TestSkip: skipped requests go through untouched (no key required).
func TestSkip(t *testing.T) {
	r := gin.New()
	mw := mw(newEngine(t), ginidem.WithSkip(func(c *gin.Context) bool {
		return c.GetHeader("X-Internal") == "1"
	}))
	r.POST("/v1/payments", mw, func(c *gin.Context) { c.Status(http.StatusCreated) })
	if got := serve(r, req{path: "/v1/payments", body: payBody, header: map[string]string{"X-Internal": "1"}}); got.status != http.StatusCreated {
		t.Errorf("skipped request = %d %q, want 201", got.status, got.body)
	}
	checkProblem(t, serve(r, req{path: "/v1/payments", body: payBody}), http.StatusBadRequest, core.ProblemMissingKey)
}

// TestNilOptionsAndEngine: nil options are ignored; a nil engine answers 500
// instead of panicking.
func TestNilOptionsAndEngine(t *testing.T) {
	r := gin.New()
	r.POST("/ok", mw(newEngine(t), nil, ginidem.WithScope(nil), ginidem.WithSkip(nil), ginidem.WithErrorHandler(nil)),
		func(c *gin.Context) { c.Status(http.StatusCreated) })
	first := serve(r, req{path: "/ok", key: "n", body: payBody})
	if first.status != http.StatusCreated {
		t.Errorf("with nil options = %d %q", first.status, first.body)
	}
	checkReplay(t, first, serve(r, req{path: "/ok", key: "n", body: payBody}))
	if m, err := ginidem.New(nil, ginidem.WithScope(func(*gin.Context) (string, error) { return "u", nil })); err == nil || m != nil {
		t.Errorf("New(nil) = %v, %v, want an error", m, err)
	}
}

// TestStoreDown: the default error handler answers the 503 problem; a custom
// one gets the error and the fallback. The handler never runs.
func TestStoreDown(t *testing.T) {
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

	def := serve(r, req{path: "/default", key: "d", body: payBody})
	checkProblem(t, def, http.StatusServiceUnavailable, core.ProblemStoreUnavailable)
	if def.header.Get("Retry-After") == "" {
		t.Errorf("503 without Retry-After")
	}
	cus := serve(r, req{path: "/custom", key: "d", body: payBody})
	if cus.status != http.StatusServiceUnavailable || string(cus.body) != `{"code":"try_later"}` {
		t.Errorf("custom = %d %q", cus.status, cus.body)
	}
	if !errors.Is(gotErr, idemtest.ErrStoreDown) || gotFallback == nil || gotFallback.Status != http.StatusServiceUnavailable {
		t.Errorf("error handler got err %v, fallback %+v", gotErr, gotFallback)
	}
	if n.Load() != 0 {
		t.Errorf("handler ran %d times with the store down", n.Load())
	}
}

// TestCommitFailure: when the outcome cannot be recorded, the client gets
// the commit-error problem, never the handler's (unrecorded) response or its
// headers.
func TestCommitFailure(t *testing.T) {
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

	got := serve(r, req{path: "/default", key: "c", body: payBody})
	checkProblem(t, got, http.StatusServiceUnavailable, core.ProblemStoreUnavailable)
	if got.header.Get("Set-Cookie") != "" || strings.Contains(string(got.body), "charged") {
		t.Errorf("the unrecorded response leaked: %v %q", got.header, got.body)
	}
	got = serve(r, req{path: "/custom", key: "c2", body: payBody})
	if got.status != http.StatusServiceUnavailable || string(got.body) != "custom" || !called.Load() {
		t.Errorf("custom = %d %q (handler called with the error: %t)", got.status, got.body, called.Load())
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
	first := serve(r, req{path: "/v1/export", key: "x", body: payBody})
	if first.status != http.StatusOK || string(first.body) != "chunk;chunk;" || first.header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("first = %d %q", first.status, first.body)
	}
	checkProblem(t, serve(r, req{path: "/v1/export", key: "x", body: payBody}), http.StatusConflict, core.ProblemNotRetained)
	if n.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", n.Load())
	}
}

// TestHijack: a hijacked connection (websocket upgrade) is never replayed.
func TestHijack(t *testing.T) {
	var n atomic.Int64
	done := make(chan struct{}, 2) // idem has recorded the outcome
	r := gin.New()
	r.Use(func(c *gin.Context) { c.Next(); done <- struct{}{} })
	r.POST("/v1/ws", mw(newEngine(t)), func(c *gin.Context) {
		n.Add(1)
		conn, rw, err := c.Writer.Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
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
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer func() { _ = conn.Close() }()
		_, _ = fmt.Fprintf(conn, "POST /v1/ws HTTP/1.1\r\nHost: x\r\nIdempotency-Key: h\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		defer func() { _ = res.Body.Close() }()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if s, b := post(); s != 200 || b != "hijacked" {
		t.Errorf("first = %d %q", s, b)
	}
	// The client had its answer before the handler returned; wait for the
	// commit before retrying.
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never finished")
	}
	if s, b := post(); s != http.StatusConflict || !strings.Contains(b, core.ProblemNotRetained) {
		t.Errorf("retry = %d %q, want 409 not-retained", s, b)
	}
	if n.Load() != 1 {
		t.Errorf("handler ran %d times", n.Load())
	}
}

// TestUnmatchedRoutes: installed with r.Use, idem also sees requests gin
// answers itself (404, 405); they pass through untouched: gin's usual
// answer, byte for byte, never a replay (issue 19: nothing is recorded for
// a route that does not exist; TestGlobalMiddlewareLeavesUnknownRoutesAlone
// checks the store).
func TestUnmatchedRoutes(t *testing.T) {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(mw(newEngine(t)))
	r.POST("/v1/payments", func(c *gin.Context) { c.Status(http.StatusCreated) })

	bare := gin.New()
	bare.HandleMethodNotAllowed = true
	bare.POST("/v1/payments", func(c *gin.Context) { c.Status(http.StatusCreated) })

	for i, tc := range []struct{ method, path string }{
		{http.MethodPost, "/v1/nope"},
		{http.MethodPatch, "/v1/payments"},
	} {
		key := fmt.Sprint("u", i)
		want := serve(bare, req{method: tc.method, path: tc.path, body: payBody})
		for range 2 {
			got := serve(r, req{method: tc.method, path: tc.path, key: key, body: payBody})
			if got.status != want.status || string(got.body) != string(want.body) || got.header.Get(core.ReplayedHeader) != "" ||
				got.header.Get("Content-Type") != want.header.Get("Content-Type") || got.header.Get("Allow") != want.header.Get("Allow") {
				t.Errorf("%s %s with idem = %d %q %v, gin alone %d %q %v", tc.method, tc.path,
					got.status, got.body, got.header, want.status, want.body, want.header)
			}
		}
	}
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
	first := serve(r, req{path: "/v1/old", key: "hc", body: payBody})
	if first.status != http.StatusCreated || string(first.body) != "new" {
		t.Errorf("first = %d %q, want the re-routed handler's answer", first.status, first.body)
	}
	checkProblem(t, serve(r, req{path: "/v1/old", key: "hc", body: payBody}), http.StatusConflict, core.ProblemNotRetained)
	if n.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", n.Load())
	}
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
	checkProblem(t, serve(r, req{path: "/log", key: "l", body: payBody}), http.StatusServiceUnavailable, core.ProblemStoreUnavailable)
	if logged.Load() != 1 {
		t.Errorf("error handler called %d times", logged.Load())
	}
	if got := serve(r, req{path: "/status", key: "l", body: payBody}); got.status != http.StatusBadGateway || len(got.body) != 0 {
		t.Errorf("status-only error handler = %d %q, want its 502", got.status, got.body)
	}
}
