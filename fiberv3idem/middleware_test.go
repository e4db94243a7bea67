package fiberv3idem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/fiberv3idem"
)

func TestNativeHandlers(t *testing.T) {
	gz := gzipped(t, []byte(`{"id":"p_1"}`))
	cases := []struct {
		name    string
		handler func(n int64) fiber.Handler // n: how many times the handler ran
		status  int
		body    string
		// final: the response is stored and replayed; otherwise the key
		// stays retryable and a retry runs the handler again.
		final bool
		check func(t *testing.T, first result)
	}{
		{
			name: "json-201",
			handler: func(n int64) fiber.Handler {
				return func(c fiber.Ctx) error {
					return c.Status(fiber.StatusCreated).JSON(fiber.Map{"id": fmt.Sprintf("p_%d", n), "amount": 1000})
				}
			},
			status: 201, body: `{"amount":1000,"id":"p_1"}`, final: true,
			check: func(t *testing.T, first result) {
				assert.Equal(t, "application/json; charset=utf-8", first.Header.Get("Content-Type"), "Content-Type")
			},
		},
		{
			name: "send-string",
			handler: func(n int64) fiber.Handler {
				return func(c fiber.Ctx) error { return c.SendString(fmt.Sprintf("hello %d", n)) }
			},
			status: 200, body: "hello 1", final: true,
		},
		{
			name: "no-content",
			handler: func(int64) fiber.Handler {
				return func(c fiber.Ctx) error { return c.Status(fiber.StatusNoContent).Send(nil) }
			},
			status: 204, body: "", final: true,
		},
		{
			name: "empty-202", // fasthttp's default Content-Type is not sent, nor replayed
			handler: func(int64) fiber.Handler {
				return func(c fiber.Ctx) error { c.Status(fiber.StatusAccepted); return nil }
			},
			status: 202, body: "", final: true,
			check: func(t *testing.T, first result) {
				assert.Empty(t, first.Header.Get("Content-Type"), "Content-Type")
			},
		},
		{
			name: "empty-201-explicit-type",
			handler: func(int64) fiber.Handler {
				return func(c fiber.Ctx) error {
					c.Set("Content-Type", "text/plain; charset=utf-8")
					return c.Status(fiber.StatusCreated).Send(nil)
				}
			},
			status: 201, body: "", final: true,
			check: func(t *testing.T, first result) {
				assert.Equal(t, "text/plain; charset=utf-8", first.Header.Get("Content-Type"), "Content-Type")
			},
		},
		{
			name: "fiber-error-400",
			handler: func(int64) fiber.Handler {
				return func(fiber.Ctx) error { return fiber.NewError(fiber.StatusBadRequest, "bad") }
			},
			status: 400, body: "bad", final: true,
		},
		{
			name: "plain-error-500",
			handler: func(int64) fiber.Handler {
				return func(fiber.Ctx) error { return errors.New("provider down") }
			},
			status: 500, body: "provider down", final: false,
		},
		{
			name: "gzip-encoded",
			handler: func(int64) fiber.Handler {
				return func(c fiber.Ctx) error {
					c.Set("Content-Encoding", "gzip")
					c.Set("Vary", "Accept-Encoding")
					c.Set("Content-Type", "application/json")
					return c.Status(fiber.StatusCreated).Send(gz)
				}
			},
			status: 201, body: string(gz), final: true,
			check: func(t *testing.T, first result) {
				assert.Equal(t, "gzip", first.Header.Get("Content-Encoding"), "Content-Encoding")
			},
		},
		{
			name: "location-and-cookie",
			handler: func(n int64) fiber.Handler {
				return func(c fiber.Ctx) error {
					c.Set("Location", fmt.Sprintf("/v1/payments/p_%d", n))
					c.Set("ETag", `"v1"`)
					c.Set("X-Debug", "not allow-listed")
					c.Cookie(&fiber.Cookie{Name: "sid", Value: "secret", HTTPOnly: true})
					return c.Status(fiber.StatusCreated).SendString("created")
				}
			},
			status: 201, body: "created", final: true,
			check: func(t *testing.T, first result) {
				assert.Equal(t, "/v1/payments/p_1", first.Header.Get("Location"), "first response headers %v", first.Header)
				assert.NotEmpty(t, first.Header.Get("Set-Cookie"), "first response headers %v", first.Header)
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int64
			h := c.handler
			app := newApp()
			app.Post("/v1/payments", mw(t, newEngine(t, nil), fiberv3idem.WithScope(tenantScope)),
				func(ctx fiber.Ctx) error { return h(runs.Add(1))(ctx) })
			url := serve(t, app) + "/v1/payments"
			cl := client(t, 0)
			send := func() result {
				return mustDo(t, cl, "POST", url, `{"amount":1000}`, "Idempotency-Key", "k-"+c.name, "X-Tenant", "t1")
			}
			first := send()
			require.Equal(t, c.status, first.Status, "first: %q", first.Body)
			require.Equal(t, c.body, first.Body, "first body")
			if c.check != nil {
				c.check(t, first)
			}
			second := send()
			if !c.final {
				require.EqualValues(t, 2, runs.Load(), "handler runs (retryable)")
				require.Empty(t, second.Header.Get(core.ReplayedHeader), "retry: %d %v", second.Status, second.Header)
				require.Equal(t, c.status, second.Status, "retry: %v", second.Header)
				return
			}
			require.EqualValues(t, 1, runs.Load(), "handler runs")
			sameResponse(t, first, second)
			assert.Empty(t, second.Header.Get("X-Debug"), "replay carries a header outside the allow-list")
			// A different body under the same key is refused.
			mismatch := mustDo(t, cl, "POST", url, `{"amount":50000}`, "Idempotency-Key", "k-"+c.name, "X-Tenant", "t1")
			assert.Equal(t, http.StatusUnprocessableEntity, mismatch.Status, "mismatch: %s", mismatch.Body)
			// Another tenant's same key is a new request.
			other := mustDo(t, cl, "POST", url, `{"amount":1000}`, "Idempotency-Key", "k-"+c.name, "X-Tenant", "t2")
			assert.Empty(t, other.Header.Get(core.ReplayedHeader), "other tenant: replayed")
			assert.EqualValues(t, 2, runs.Load(), "other tenant: handler runs")
		})
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	const n = 50
	var runs atomic.Int64
	// The owner's handler returns only once release is closed: after the
	// duplicates were answered, and in any case when the test function
	// returns (before the server's cleanup waits for the handler).
	release := make(chan struct{})
	releaseOwner := sync.OnceFunc(func() { close(release) })
	defer releaseOwner()
	app := newApp()
	app.Post("/pay", mw(t, newEngine(t, nil)), func(c fiber.Ctx) error {
		runs.Add(1)
		<-release
		return c.Status(fiber.StatusCreated).SendString("charged once")
	})
	url := serve(t, app) + "/pay"
	cl := client(t, 0)

	results := make([]result, n)
	var wg sync.WaitGroup
	var answered atomic.Int64
	allButOne := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			r, err := do(cl, "POST", url, `{"amount":1}`, "Idempotency-Key", "dup")
			assert.NoError(t, err, "request %d", i) // not require: another goroutine
			results[i] = r
			if answered.Add(1) == n-1 {
				close(allButOne)
			}
		})
	}
	// The owner blocks until every duplicate has been answered, so all of
	// them arrive while it is in flight. The deadline only bounds a failure.
	select {
	case <-allButOne:
	case <-time.After(20 * time.Second):
		assert.Fail(t, "duplicates were not answered while the first request was in flight")
	}
	releaseOwner()
	wg.Wait()

	require.EqualValues(t, 1, runs.Load(), "handler runs")
	var created, conflict int
	for i, r := range results {
		switch r.Status {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
			conflict++
			assert.NotEmpty(t, r.Header.Get("Retry-After"), "409 %d: headers %v", i, r.Header)
			assert.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), "409 %d: headers %v", i, r.Header)
		default:
			assert.Failf(t, "unexpected response", "response %d: %d %s", i, r.Status, r.Body)
		}
	}
	require.Equal(t, 1, created, "created")
	require.Equal(t, n-1, conflict, "conflict")
	replay := mustDo(t, cl, "POST", url, `{"amount":1}`, "Idempotency-Key", "dup")
	assert.Equal(t, http.StatusCreated, replay.Status, "replay after completion")
	assert.Equal(t, "charged once", replay.Body, "replay after completion")
	assert.Equal(t, "true", replay.Header.Get(core.ReplayedHeader), "replay after completion: %v", replay.Header)
}

func TestPanicReleasesKey(t *testing.T) {
	var runs atomic.Int64
	app := newApp()
	// Earlier middleware sets a header before the chain runs: it survives
	// the problem written in place of the handler's response.
	app.Use(func(c fiber.Ctx) error {
		c.Set("X-Request-ID", "req-1")
		return c.Next()
	})
	app.Post("/pay", mw(t, newEngine(t, nil)), func(c fiber.Ctx) error {
		if runs.Add(1) == 1 {
			c.Set("X-Handler", "half-done")
			c.Cookie(&fiber.Cookie{Name: "sid", Value: "leak"})
			_ = c.Status(fiber.StatusCreated).SendString("partial")
			panic("boom")
		}
		return c.Status(fiber.StatusCreated).SendString("ok")
	})
	url := serve(t, app) + "/pay"
	cl := client(t, 0)

	r := mustDo(t, cl, "POST", url, "x", "Idempotency-Key", "p1")
	require.Equal(t, http.StatusInternalServerError, r.Status, "panic answer: %v %s", r.Header, r.Body)
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), "panic answer: %v %s", r.Header, r.Body)
	var p problem.Details
	require.NoError(t, json.Unmarshal([]byte(r.Body), &p), "problem %q", r.Body)
	require.Equal(t, problem.BaseURI+problem.HandlerPanic, p.Type, "problem %q", r.Body)
	assert.Empty(t, r.Header.Get("X-Handler"), "the handler's headers went out with the problem: %v", r.Header)
	assert.Empty(t, r.Header.Get("Set-Cookie"), "the handler's headers went out with the problem: %v", r.Header)
	assert.Equal(t, "req-1", r.Header.Get("X-Request-ID"), "earlier middleware's header lost: %v", r.Header)
	// The key is retryable: the retry runs the handler.
	r = mustDo(t, cl, "POST", url, "x", "Idempotency-Key", "p1")
	assert.Equal(t, http.StatusCreated, r.Status, "retry")
	assert.Equal(t, "ok", r.Body, "retry")
	assert.EqualValues(t, 2, runs.Load(), "retry: handler runs")
}

// retainingStore keeps, without copying, everything fiberv3idem hands to
// the store: the claim's strings and the response given to Complete. A
// store may legitimately keep them (memstore happens to copy), so none of
// it may alias a fasthttp buffer.
type retainingStore struct {
	core.Store
	mu       sync.Mutex
	claims   map[string]storekit.ClaimRequest // first claim, by key
	complete map[string]storekit.StoredResponse
}

func (s *retainingStore) Claim(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
	s.mu.Lock()
	if _, ok := s.claims[r.Key]; !ok {
		s.claims[r.Key] = r
	}
	s.mu.Unlock()
	return s.Store.Claim(ctx, r)
}

func (s *retainingStore) Complete(ctx context.Context, f storekit.Fence, r storekit.StoredResponse) error {
	s.mu.Lock()
	s.complete[f.Key] = r
	s.mu.Unlock()
	return s.Store.Complete(ctx, f, r)
}

// TestBufferReuse would fail if fiberv3idem kept any slice or string
// aliasing fasthttp's buffers: fasthttp reuses one RequestCtx per
// connection, so the later requests on the same connection overwrite the
// bytes an aliased key, scope, route, header or body would point to.
func TestBufferReuse(t *testing.T) {
	for _, mount := range []string{"route", "use"} {
		t.Run(mount, func(t *testing.T) {
			mem := memstore.New()
			store := &retainingStore{Store: mem, claims: map[string]storekit.ClaimRequest{}, complete: map[string]storekit.StoredResponse{}}
			eng := newEngine(t, store)
			app := newApp()
			var mu sync.Mutex
			keysSeen := map[string]string{} // key from the lease as the handler kept it, by body
			handler := func(c fiber.Ctx) error {
				key, _ := core.KeyFromContext(c.Context())
				mu.Lock()
				keysSeen[string(c.Body())] = key // the key string is kept past the request
				mu.Unlock()
				c.Set("Location", "/items/"+c.Get("X-Item"))
				// c.Send hands the request's body buffer to the response as
				// is: the captured body aliases the request buffer unless
				// fiberv3idem copies it.
				return c.Status(fiber.StatusCreated).Send(c.Body())
			}
			m := mw(t, eng, fiberv3idem.WithScope(tenantScope))
			methods := []string{"POST", "PATCH"}
			if mount == "use" {
				app.Use(m)
				app.Add(methods, "/items/:id", handler)
			} else {
				app.Add(methods, "/items/:id", m, handler)
			}
			base := serve(t, app)
			cl := client(t, 1) // one connection: one fasthttp RequestCtx, reused

			bodyA := strings.Repeat("A", 100)
			sendA := func() result {
				return mustDo(t, cl, "POST", base+"/items/1", bodyA,
					"Idempotency-Key", "key-aaaa", "X-Tenant", "tenant-a", "X-Item", "aaaa")
			}
			first := sendA()
			require.Equal(t, 201, first.Status, "first: %q", first.Body)
			require.Equal(t, bodyA, first.Body, "first body")
			for i := range 200 {
				// Same lengths and longer ones, so that fasthttp overwrites
				// in place and also grows its buffers.
				body := strings.Repeat(string(rune('B'+i%20)), 100+i%3*50)
				r := mustDo(t, cl, methods[i%2], fmt.Sprintf("%s/items/%d", base, 2+i%3*10), body,
					"Idempotency-Key", fmt.Sprintf("key-%04d", i), "X-Tenant", fmt.Sprintf("tenant-%d", i%10),
					"X-Item", fmt.Sprintf("%04d", i))
				require.Equal(t, 201, r.Status, "request %d: %q", i, r.Body)
				require.Equal(t, body, r.Body, "request %d body", i)
			}

			// Before A is sent again (which would rewrite the buffers with
			// A's bytes), everything kept from A must still be A's.
			wantRoute := "/items/{id}"
			if mount == "use" {
				wantRoute = "/items/1"
			}
			store.mu.Lock()
			claim, done := store.claims["key-aaaa"], store.complete["key-aaaa"]
			store.mu.Unlock()
			assert.Equal(t, "tenant-a", claim.Scope, "claim of A changed: %+v", claim)
			assert.Equal(t, "key-aaaa", claim.Key, "claim of A changed: %+v", claim)
			assert.Equal(t, "POST", claim.Method, "claim of A changed: %+v", claim)
			assert.Equal(t, wantRoute, claim.Route, "claim of A changed: %+v", claim)
			assert.Equal(t, bodyA, string(done.Body), "response of A changed")
			assert.Equal(t, "/items/aaaa", done.Header.Get("Location"), "response of A changed: %v", done.Header)
			rec, err := mem.Get(context.Background(), "tenant-a", "key-aaaa")
			require.NoError(t, err, "record of A")
			assert.Equal(t, wantRoute, rec.Route, "record of A: route")
			if assert.NotNil(t, rec.Response, "record of A: response") {
				assert.Equal(t, bodyA, string(rec.Response.Body), "record of A: response body")
			}
			mu.Lock()
			assert.Equal(t, "key-aaaa", keysSeen[bodyA], "key kept by the handler changed")
			mu.Unlock()

			replay := sendA()
			sameResponse(t, first, replay)
			assert.Equal(t, "/items/aaaa", replay.Header.Get("Location"), "replayed Location")
		})
	}
}

// TestContext: the handler's c.Context() carries the lease and the outer
// middleware's values; outer middleware gets its own context back.
func TestContext(t *testing.T) {
	type ctxKey struct{}
	app := newApp()
	var afterErr error
	var afterHasKey, outerValue bool
	app.Use(func(c fiber.Ctx) error {
		c.SetContext(context.WithValue(c.Context(), ctxKey{}, "outer"))
		err := c.Next()
		_, afterHasKey = core.KeyFromContext(c.Context())
		afterErr = c.Context().Err()
		outerValue = c.Context().Value(ctxKey{}) == "outer"
		return err
	})
	var inKey, relay string
	var inOuter bool
	app.Post("/pay", mw(t, newEngine(t, nil)), func(c fiber.Ctx) error {
		inKey, _ = core.KeyFromContext(c.Context())
		relay = core.RelayKey(c.Context(), "charge")
		inOuter = c.Context().Value(ctxKey{}) == "outer"
		return c.SendStatus(fiber.StatusCreated)
	})
	url := serve(t, app) + "/pay"
	r := mustDo(t, client(t, 0), "POST", url, "", "Idempotency-Key", `"sf-key"`)
	require.Equal(t, 201, r.Status, "status")
	assert.Equal(t, "sf-key", inKey, "key the handler saw")
	assert.NotEmpty(t, relay, "relay key the handler derived")
	assert.True(t, inOuter, "handler saw the outer middleware's context value")
	assert.False(t, afterHasKey, "outer middleware after the handler: lease still in the context")
	assert.NoError(t, afterErr, "outer middleware after the handler: context error")
	assert.True(t, outerValue, "outer middleware after the handler: its own value")
}

func TestMountedAppErrorHandler(t *testing.T) {
	var runs atomic.Int64
	sub := fiber.New(fiber.Config{ErrorHandler: func(c fiber.Ctx, err error) error {
		return c.Status(fiber.StatusTeapot).JSON(fiber.Map{"error": err.Error()})
	}})
	sub.Post("/pay", mw(t, newEngine(t, nil)), func(fiber.Ctx) error {
		runs.Add(1)
		return errors.New("declined")
	})
	app := newApp()
	app.Use("/sub", sub)
	url := serve(t, app) + "/sub/pay"
	cl := client(t, 0)
	first := mustDo(t, cl, "POST", url, "{}", "Idempotency-Key", "e1")
	require.Equal(t, fiber.StatusTeapot, first.Status, "first: %q", first.Body)
	require.Equal(t, `{"error":"declined"}`, first.Body, "first body")
	sameResponse(t, first, mustDo(t, cl, "POST", url, "{}", "Idempotency-Key", "e1"))
	assert.EqualValues(t, 1, runs.Load(), "handler runs")
}

func TestStreamedAndTruncated(t *testing.T) {
	cases := []struct {
		name    string
		opts    []core.Option
		handler fiber.Handler
		body    string
	}{
		{"send-stream", nil, func(c fiber.Ctx) error {
			return c.SendStream(strings.NewReader("streamed body"))
		}, "streamed body"},
		{"send-stream-writer", nil, func(c fiber.Ctx) error {
			return c.SendStreamWriter(func(w *bufio.Writer) {
				_, _ = w.WriteString("chunk1,")
				_ = w.Flush()
				_, _ = w.WriteString("chunk2")
			})
		}, "chunk1,chunk2"},
		{"truncated", []core.Option{core.WithMaxResponseBytes(10)}, func(c fiber.Ctx) error {
			return c.SendString(strings.Repeat("x", 100))
		}, strings.Repeat("x", 100)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			h := tc.handler
			app := newApp()
			app.Post("/dl", mw(t, newEngine(t, nil, tc.opts...)), func(c fiber.Ctx) error {
				runs.Add(1)
				return h(c)
			})
			url := serve(t, app) + "/dl"
			cl := client(t, 0)
			r := mustDo(t, cl, "POST", url, "", "Idempotency-Key", "s1")
			require.Equal(t, 200, r.Status, "first: %q", r.Body)
			require.Equal(t, tc.body, r.Body, "first body")
			r = mustDo(t, cl, "POST", url, "", "Idempotency-Key", "s1")
			require.Equal(t, http.StatusConflict, r.Status, "retry: %s", r.Body)
			var p problem.Details
			require.NoError(t, json.Unmarshal([]byte(r.Body), &p), "retry: %s", r.Body)
			require.Equal(t, problem.BaseURI+problem.NotRetained, p.Type, "retry: %s", r.Body)
			assert.EqualValues(t, 1, runs.Load(), "handler runs")
		})
	}
}

// failingStore fails the chosen operations.
type failingStore struct {
	core.Store
	claim, complete error
}

func (s *failingStore) Claim(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
	if s.claim != nil {
		return storekit.ClaimResult{}, s.claim
	}
	return s.Store.Claim(ctx, r)
}

func (s *failingStore) Complete(ctx context.Context, f storekit.Fence, r storekit.StoredResponse) error {
	if s.complete != nil {
		return s.complete
	}
	return s.Store.Complete(ctx, f, r)
}

func TestStoreFailures(t *testing.T) {
	down := errors.New("connection refused")
	t.Run("claim-default", func(t *testing.T) {
		var runs atomic.Int64
		app := newApp()
		app.Post("/pay", mw(t, newEngine(t, &failingStore{Store: memstore.New(), claim: down})),
			func(c fiber.Ctx) error { runs.Add(1); return c.SendString("ran") })
		r := mustDo(t, client(t, 0), "POST", serve(t, app)+"/pay", "", "Idempotency-Key", "f1")
		assert.Equal(t, 503, r.Status, "%v %s", r.Header, r.Body)
		assert.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), "%v %s", r.Header, r.Body)
		assert.NotEmpty(t, r.Header.Get("Retry-After"), "%v %s", r.Header, r.Body)
		assert.Zero(t, runs.Load(), "handler runs")
	})
	t.Run("claim-custom", func(t *testing.T) {
		var gotErr error
		var gotFallback *adapterkit.Response
		app := newApp()
		app.Post("/pay", mw(t, newEngine(t, &failingStore{Store: memstore.New(), claim: down}),
			fiberv3idem.WithErrorHandler(func(c fiber.Ctx, err error, fallback *adapterkit.Response) error {
				gotErr, gotFallback = err, fallback
				return c.Status(fiber.StatusServiceUnavailable).SendString("try later")
			})),
			func(c fiber.Ctx) error { return c.SendString("ran") })
		r := mustDo(t, client(t, 0), "POST", serve(t, app)+"/pay", "", "Idempotency-Key", "f1")
		assert.Equal(t, 503, r.Status, "status")
		assert.Equal(t, "try later", r.Body, "body")
		assert.ErrorIs(t, gotErr, down, "error handed to the error handler")
		if assert.NotNil(t, gotFallback, "fallback handed to the error handler") {
			assert.Equal(t, 503, gotFallback.Status, "fallback status")
		}
	})
	t.Run("commit", func(t *testing.T) {
		app := newApp()
		app.Use(func(c fiber.Ctx) error {
			c.Set("Access-Control-Allow-Origin", "*")
			return c.Next()
		})
		app.Post("/pay", mw(t, newEngine(t, &failingStore{Store: memstore.New(), complete: down})),
			func(c fiber.Ctx) error {
				c.Set("Location", "/v1/payments/p_1")
				c.Cookie(&fiber.Cookie{Name: "sid", Value: "x"})
				return c.Status(fiber.StatusCreated).SendString("charged")
			})
		r := mustDo(t, client(t, 0), "POST", serve(t, app)+"/pay", "", "Idempotency-Key", "f1")
		require.Equal(t, 503, r.Status, "%v %s", r.Header, r.Body)
		require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), "%v %s", r.Header, r.Body)
		require.NotContains(t, r.Body, "charged")
		assert.Empty(t, r.Header.Get("Location"), "handler headers survived a failed commit: %v", r.Header)
		assert.Empty(t, r.Header.Get("Set-Cookie"), "handler headers survived a failed commit: %v", r.Header)
		assert.Equal(t, "*", r.Header.Get("Access-Control-Allow-Origin"), "earlier middleware's header lost: %v", r.Header)
	})
}

// TestDiscardDropsHijack: a handler that hijacked the connection with
// fasthttp (its hijack handler runs once the chain returned, here writing
// its own 201) and then failed (its outcome could not be recorded, or it
// panicked) must not reach the client through that hijack: idem answers
// with its problem instead.
func TestDiscardDropsHijack(t *testing.T) {
	hijack := func(c fiber.Ctx) {
		c.RequestCtx().HijackSetNoResponse(true)
		c.RequestCtx().Hijack(func(conn net.Conn) {
			_, _ = conn.Write([]byte("HTTP/1.1 201 Created\r\nContent-Length: 7\r\nConnection: close\r\n\r\ncharged"))
		})
	}
	cases := []struct {
		name    string
		store   core.Store
		handler fiber.Handler
		status  int
	}{
		{"commit_fails", &failingStore{Store: memstore.New(), complete: errors.New("db down at commit")},
			func(c fiber.Ctx) error { hijack(c); return nil }, http.StatusServiceUnavailable},
		{"panic", memstore.New(), func(c fiber.Ctx) error { hijack(c); panic("ledger down") }, http.StatusInternalServerError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			app := newApp()
			app.Use(recover.New())
			app.Post("/pay", mw(t, newEngine(t, tc.store)), tc.handler)
			r, err := do(client(t, 0), "POST", serve(t, app)+"/pay", "{}", "Idempotency-Key", "h1")
			require.NoError(t, err, "POST")
			assert.Equal(t, tc.status, r.Status, "client got %q; want idem's problem", r.Body)
			assert.NotEqual(t, "charged", r.Body, "the hijacked response reached the client")
		})
	}
}

func TestOptions(t *testing.T) {
	var runs atomic.Int64
	h := func(c fiber.Ctx) error { runs.Add(1); return c.SendString("ok") }
	app := newApp()
	eng := newEngine(t, nil)
	app.Post("/skip", mw(t, eng, fiberv3idem.WithSkip(func(c fiber.Ctx) bool { return c.Get("X-Skip") == "1" })), h)
	app.Post("/scope", mw(t, eng, fiberv3idem.WithScope(func(fiber.Ctx) (string, error) { return "", errors.New("no user") })), h)
	app.Post("/nil", mw(t, eng, nil, fiberv3idem.WithScope(nil), fiberv3idem.WithSkip(nil), fiberv3idem.WithRoute(nil), fiberv3idem.WithErrorHandler(nil)), h)
	app.Post("/route", mw(t, eng, fiberv3idem.WithRoute(func(fiber.Ctx) string { return "custom" })), h)
	app.Get("/get", mw(t, eng), h)
	base := serve(t, app)
	cl := client(t, 0)

	r := mustDo(t, cl, "POST", base+"/skip", "", "X-Skip", "1")
	assert.Equal(t, 200, r.Status, "skip: %s", r.Body)
	r = mustDo(t, cl, "POST", base+"/skip", "")
	assert.Equal(t, 400, r.Status, "not skipped, no key: %s", r.Body)
	r = mustDo(t, cl, "POST", base+"/scope", "", "Idempotency-Key", "k")
	assert.Equal(t, 401, r.Status, "scope error: %s", r.Body)
	r = mustDo(t, cl, "POST", base+"/scope", "")
	assert.Equal(t, 400, r.Status, "scope not evaluated before the key check: %s", r.Body)
	r = mustDo(t, cl, "POST", base+"/nil", "", "Idempotency-Key", "k")
	assert.Equal(t, 200, r.Status, "nil options: %s", r.Body)
	r = mustDo(t, cl, "POST", base+"/route", "", "Idempotency-Key", "k2")
	assert.Equal(t, 200, r.Status, "custom route: %s", r.Body)
	if rec, err := eng.Store().Get(context.Background(), "", "k2"); assert.NoError(t, err, "custom route record") {
		assert.Equal(t, "custom", rec.Route, "custom route record: %+v", rec)
	}
	m, err := fiberv3idem.New(nil, fiberv3idem.WithScope(func(fiber.Ctx) (string, error) { return "u", nil }))
	assert.Error(t, err, "New(nil)")
	assert.Nil(t, m, "New(nil)")
	r = mustDo(t, cl, "GET", base+"/get", "")
	assert.Equal(t, 200, r.Status, "GET bypass: %s", r.Body)
	r = mustDo(t, cl, "POST", base+"/nil", "", "Idempotency-Key", "bad key with spaces")
	assert.Equal(t, 400, r.Status, "invalid key: %s", r.Body)
}

// TestEngineReadsHeaders covers the headers the engine reads through
// fiberv3idem's header reader: a core.WithScope function reading any
// request header, and WithFingerprintHeaders, with fasthttp's header
// normalising on and off.
func TestEngineReadsHeaders(t *testing.T) {
	for _, raw := range []bool{false, true} {
		t.Run(map[bool]string{false: "normalised", true: "not-normalised"}[raw], func(t *testing.T) {
			eng := newEngine(t, nil,
				core.WithScope(func(_ context.Context, r *core.Request) (string, error) {
					if s := r.Header.Get("X-Tenant"); s != "" {
						return s, nil
					}
					return "", errors.New("no tenant")
				}),
				core.WithFingerprintHeaders("X-Amount-Currency"))
			app := newApp(fiber.Config{DisableHeaderNormalizing: raw})
			runs := 0
			app.Post("/pay", mw(t, eng), func(c fiber.Ctx) error {
				runs++
				return c.Status(fiber.StatusCreated).SendString("ok")
			})
			// Lower-case names: as sent when fasthttp does not normalise.
			send := func(tenant, currency string) int {
				req := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
				req.Header["idempotency-key"] = []string{"k1"}
				req.Header["x-amount-currency"] = []string{currency}
				if tenant != "" {
					req.Header["x-tenant"] = []string{tenant}
				}
				status, _, _ := test(t, app, req)
				return status
			}
			assert.Equal(t, http.StatusUnauthorized, send("", "JPY"), "no tenant")
			assert.Equal(t, http.StatusCreated, send("a", "JPY"), "tenant a")
			assert.Equal(t, http.StatusCreated, send("b", "JPY"), "tenant b, same key: its own execution")
			assert.Equal(t, 2, runs, "runs after tenant b, same key: its own execution")
			assert.Equal(t, http.StatusUnprocessableEntity, send("a", "USD"), "tenant a, other fingerprint header")
			assert.Equal(t, http.StatusCreated, send("a", "JPY"), "tenant a retry: a replay")
			assert.Equal(t, 2, runs, "runs after tenant a retry: a replay")
		})
	}
}

// TestReplayBodyEditedInPlace: a replay's body is the store's (records are
// shared, read-only); middleware that edits c.Response().Body() in place
// must edit fasthttp's copy, not the stored bytes.
func TestReplayBodyEditedInPlace(t *testing.T) {
	eng := newEngine(t, memstore.New())
	app := newApp()
	app.Use(func(c fiber.Ctx) error {
		err := c.Next()
		b := c.Response().Body()
		for i := range b {
			if 'a' <= b[i] && b[i] <= 'z' {
				b[i] -= 'a' - 'A'
			}
		}
		return err
	})
	app.Post("/pay", mw(t, eng), func(c fiber.Ctx) error {
		return c.Status(fiber.StatusCreated).SendString("paid")
	})
	base := serve(t, app)
	cl := client(t, 1)
	for i := range 3 {
		r := mustDo(t, cl, "POST", base+"/pay", "{}", "Idempotency-Key", "edit-1")
		require.Equal(t, fiber.StatusCreated, r.Status, "request %d: %q", i, r.Body)
		require.Equal(t, "PAID", r.Body, "request %d", i)
	}
	rec, err := eng.Store().Get(context.Background(), "", "edit-1")
	require.NoError(t, err, "stored")
	require.NotNil(t, rec.Response, "stored response")
	require.Equal(t, "paid", string(rec.Response.Body), "stored body") // recorded before the edit
}
