package fiberidem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/fiberidem"
)

func TestNativeHandlers(t *testing.T) {
	gz := gzipped(t, []byte(`{"id":"p_1"}`))
	type tc struct {
		name    string
		handler func(n int64) fiber.Handler // n: how many times the handler ran
		status  int
		body    string
		// final: the response is stored and replayed; otherwise the key
		// stays retryable and a retry runs the handler again.
		final bool
		check func(t *testing.T, first result)
	}
	cases := []tc{
		{
			name: "json-201",
			handler: func(n int64) fiber.Handler {
				return func(c *fiber.Ctx) error {
					return c.Status(fiber.StatusCreated).JSON(fiber.Map{"id": fmt.Sprintf("p_%d", n), "amount": 1000})
				}
			},
			status: 201, body: `{"amount":1000,"id":"p_1"}`, final: true,
			check: func(t *testing.T, first result) {
				assert.Equal(t, "application/json", first.Header.Get("Content-Type"), "Content-Type")
			},
		},
		{
			name: "send-string",
			handler: func(n int64) fiber.Handler {
				return func(c *fiber.Ctx) error { return c.SendString(fmt.Sprintf("hello %d", n)) }
			},
			status: 200, body: "hello 1", final: true,
		},
		{
			name: "no-content",
			handler: func(int64) fiber.Handler {
				return func(c *fiber.Ctx) error { return c.Status(fiber.StatusNoContent).Send(nil) }
			},
			status: 204, body: "", final: true,
		},
		{
			name: "fiber-error-400",
			handler: func(int64) fiber.Handler {
				return func(*fiber.Ctx) error { return fiber.NewError(fiber.StatusBadRequest, "bad") }
			},
			status: 400, body: "bad", final: true,
		},
		{
			name: "plain-error-500",
			handler: func(int64) fiber.Handler {
				return func(*fiber.Ctx) error { return errors.New("provider down") }
			},
			status: 500, body: "provider down", final: false,
		},
		{
			name: "gzip-encoded",
			handler: func(int64) fiber.Handler {
				return func(c *fiber.Ctx) error {
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
				return func(c *fiber.Ctx) error {
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
			app.Post("/v1/payments", mw(t, newEngine(t, nil), fiberidem.WithScope(tenantScope)),
				func(ctx *fiber.Ctx) error { return h(runs.Add(1))(ctx) })
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
	const n = 100
	var runs atomic.Int64
	// The owner's handler returns only once release is closed: below, after
	// the duplicates were answered, and in any case when the test function
	// returns (before the server's cleanup waits for the handler).
	release := make(chan struct{})
	releaseOwner := sync.OnceFunc(func() { close(release) })
	defer releaseOwner()
	app := newApp()
	app.Post("/pay", mw(t, newEngine(t, nil)), func(c *fiber.Ctx) error {
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := do(cl, "POST", url, `{"amount":1}`, "Idempotency-Key", "dup")
			assert.NoError(t, err, "request %d", i) // not require: another goroutine
			results[i] = r
			if answered.Add(1) == n-1 {
				close(allButOne)
			}
		}()
	}
	// The owner blocks until every duplicate has been answered (the signal
	// allButOne), so all of them arrive while it is in flight. The deadline
	// only bounds a failure.
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
	app.Use(func(c *fiber.Ctx) error {
		c.Set("X-Request-ID", "req-1")
		return c.Next()
	})
	app.Post("/pay", mw(t, newEngine(t, nil)), func(c *fiber.Ctx) error {
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

// retainingStore keeps, without copying, everything fiberidem hands to the
// store: the claim's strings and the response given to Complete. A store
// may legitimately keep them (memstore happens to copy), so none of it may
// alias a fasthttp buffer.
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

// TestBufferReuse would fail if fiberidem kept any slice or string aliasing
// fasthttp's buffers: fasthttp reuses one RequestCtx per connection, so the
// later requests on the same connection overwrite the bytes an aliased
// key, scope, method, route, header or body would point to.
func TestBufferReuse(t *testing.T) {
	for _, mount := range []string{"route", "use"} {
		t.Run(mount, func(t *testing.T) {
			mem := memstore.New()
			store := &retainingStore{Store: mem, claims: map[string]storekit.ClaimRequest{}, complete: map[string]storekit.StoredResponse{}}
			eng := newEngine(t, store)
			app := newApp()
			var mu sync.Mutex
			keysSeen := map[string]string{} // key from the lease as the handler kept it, by body
			handler := func(c *fiber.Ctx) error {
				key, _ := core.KeyFromContext(c.UserContext())
				mu.Lock()
				keysSeen[string(c.Body())] = key // the key string is kept past the request
				mu.Unlock()
				c.Set("Location", "/items/"+c.Get("X-Item"))
				// c.Send hands the request's body buffer to the response
				// as is: the captured body aliases the request buffer unless
				// fiberidem copies it.
				return c.Status(fiber.StatusCreated).Send(c.Body())
			}
			m := mw(t, eng, fiberidem.WithScope(tenantScope))
			if mount == "use" {
				app.Use(m)
				app.Add("POST", "/items/:id", handler)
				app.Add("PATCH", "/items/:id", handler)
			} else {
				app.Add("POST", "/items/:id", m, handler)
				app.Add("PATCH", "/items/:id", m, handler)
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
				method := []string{"POST", "PATCH"}[i%2] // the last one is PATCH
				body := strings.Repeat(string(rune('B'+i%20)), 100+i%3*50)
				r := mustDo(t, cl, method, fmt.Sprintf("%s/items/%d", base, 2+i%3*10), body,
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
			assert.Equal(t, "POST", rec.Method, "record of A: method")
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

func TestUserContext(t *testing.T) {
	type ctxKey struct{}
	app := newApp()
	var afterErr error
	var afterHasKey, outerValue bool
	app.Use(func(c *fiber.Ctx) error {
		c.SetUserContext(context.WithValue(c.UserContext(), ctxKey{}, "outer"))
		err := c.Next()
		_, afterHasKey = core.KeyFromContext(c.UserContext())
		afterErr = c.UserContext().Err()
		outerValue = c.UserContext().Value(ctxKey{}) == "outer"
		return err
	})
	var inKey, relay string
	var inOuter bool
	app.Post("/pay", mw(t, newEngine(t, nil)), func(c *fiber.Ctx) error {
		inKey, _ = core.KeyFromContext(c.UserContext())
		relay = core.RelayKey(c.UserContext(), "charge")
		inOuter = c.UserContext().Value(ctxKey{}) == "outer"
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
	sub := fiber.New(fiber.Config{ErrorHandler: func(c *fiber.Ctx, err error) error {
		return c.Status(fiber.StatusTeapot).JSON(fiber.Map{"error": err.Error()})
	}})
	sub.Post("/pay", mw(t, newEngine(t, nil)), func(*fiber.Ctx) error {
		runs.Add(1)
		return errors.New("declined")
	})
	app := newApp()
	app.Mount("/sub", sub)
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
		{"send-stream", nil, func(c *fiber.Ctx) error {
			return c.SendStream(strings.NewReader("streamed body"))
		}, "streamed body"},
		{"body-stream-writer", nil, func(c *fiber.Ctx) error {
			c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
				_, _ = w.WriteString("chunk1,")
				_ = w.Flush()
				_, _ = w.WriteString("chunk2")
			})
			return nil
		}, "chunk1,chunk2"},
		{"truncated", []core.Option{core.WithMaxResponseBytes(10)}, func(c *fiber.Ctx) error {
			return c.SendString(strings.Repeat("x", 100))
		}, strings.Repeat("x", 100)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			h := tc.handler
			app := newApp()
			app.Post("/dl", mw(t, newEngine(t, nil, tc.opts...)), func(c *fiber.Ctx) error {
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
			func(c *fiber.Ctx) error { runs.Add(1); return c.SendString("ran") })
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
			fiberidem.WithErrorHandler(func(c *fiber.Ctx, err error, fallback *adapterkit.Response) error {
				gotErr, gotFallback = err, fallback
				return c.Status(fiber.StatusServiceUnavailable).SendString("try later")
			})),
			func(c *fiber.Ctx) error { return c.SendString("ran") })
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
		app.Use(func(c *fiber.Ctx) error {
			c.Set("Access-Control-Allow-Origin", "*")
			return c.Next()
		})
		app.Post("/pay", mw(t, newEngine(t, &failingStore{Store: memstore.New(), complete: down})),
			func(c *fiber.Ctx) error {
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

func TestOptions(t *testing.T) {
	var runs atomic.Int64
	h := func(c *fiber.Ctx) error { runs.Add(1); return c.SendString("ok") }
	app := newApp()
	eng := newEngine(t, nil)
	app.Post("/skip", mw(t, eng, fiberidem.WithSkip(func(c *fiber.Ctx) bool { return c.Get("X-Skip") == "1" })), h)
	app.Post("/scope", mw(t, eng, fiberidem.WithScope(func(*fiber.Ctx) (string, error) { return "", errors.New("no user") })), h)
	app.Post("/nil", mw(t, eng, nil, fiberidem.WithScope(nil), fiberidem.WithSkip(nil), fiberidem.WithRoute(nil), fiberidem.WithErrorHandler(nil)), h)
	app.Post("/route", mw(t, eng, fiberidem.WithRoute(func(*fiber.Ctx) string { return "custom" })), h)
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
	m, err := fiberidem.New(nil, fiberidem.WithScope(func(*fiber.Ctx) (string, error) { return "u", nil }))
	assert.Error(t, err, "New(nil)")
	assert.Nil(t, m, "New(nil)")
	r = mustDo(t, cl, "GET", base+"/get", "")
	assert.Equal(t, 200, r.Status, "GET bypass: %s", r.Body)
	r = mustDo(t, cl, "POST", base+"/nil", "", "Idempotency-Key", "bad key with spaces")
	assert.Equal(t, 400, r.Status, "invalid key: %s", r.Body)
}

// TestUseMountedRoutes: registered with app.Use or Group.Use, c.Route() is
// the middleware's prefix route, so the fingerprint uses the request path:
// one key on two endpoints is refused instead of replaying the wrong one.
func TestUseMountedRoutes(t *testing.T) {
	store := memstore.New()
	app := newApp()
	v1 := app.Group("/v1")
	v1.Use(mw(t, newEngine(t, store)))
	v1.Post("/payments", func(c *fiber.Ctx) error { return c.Status(201).SendString("payment") })
	v1.Post("/refunds", func(c *fiber.Ctx) error { return c.Status(201).SendString("refund") })
	base := serve(t, app)
	cl := client(t, 0)
	r := mustDo(t, cl, "POST", base+"/v1/payments", "{}", "Idempotency-Key", "u1")
	require.Equal(t, 201, r.Status, "payments: %q", r.Body)
	require.Equal(t, "payment", r.Body, "payments")
	r = mustDo(t, cl, "POST", base+"/v1/refunds", "{}", "Idempotency-Key", "u1")
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "same key on another route: %q", r.Body)
	r = mustDo(t, cl, "POST", base+"/v1/payments", "{}", "Idempotency-Key", "u1")
	require.Equal(t, "payment", r.Body, "replay: %d", r.Status)
	require.Equal(t, "true", r.Header.Get(core.ReplayedHeader), "replay: %d %q", r.Status, r.Body)
	rec, err := store.Get(context.Background(), "", "u1")
	require.NoError(t, err, "record")
	require.Equal(t, "/v1/payments", rec.Route, "record route")
}

// TestReplayBodyEditedInPlace: a replay's body is the store's (records are
// shared, read-only); middleware that edits c.Response().Body() in place
// (here: upper-casing it) must edit fasthttp's copy, not the stored bytes,
// so that every replay starts from the response as first recorded.
func TestReplayBodyEditedInPlace(t *testing.T) {
	eng := newEngine(t, memstore.New())
	app := newApp()
	app.Use(func(c *fiber.Ctx) error {
		err := c.Next()
		b := c.Response().Body()
		for i := range b {
			if 'a' <= b[i] && b[i] <= 'z' {
				b[i] -= 'a' - 'A'
			}
		}
		return err
	})
	app.Post("/pay", mw(t, eng), func(c *fiber.Ctx) error {
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
