package fiberidem_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/fiberidem"
)

func newEngine(t *testing.T, store core.Store, opts ...core.Option) *core.Engine {
	t.Helper()
	if store == nil {
		store = memstore.New()
	}
	eng, err := core.New(store, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// gzipped compresses s with the standard library (fasthttp's gzip keeps
// worker goroutines alive for the process, which goleak would report).
func gzipped(s string) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return buf.Bytes()
}

func tenantScope(c *fiber.Ctx) (string, error) {
	// c.Get aliases fasthttp's buffer; fiberidem copies what it keeps.
	return c.Get("X-Tenant"), nil
}

// sameResponse checks that a replay is the first response again: status,
// body and every allow-listed header, plus Idempotent-Replayed: true, and
// never Set-Cookie.
func sameResponse(t *testing.T, first, replay result) {
	t.Helper()
	if first.Header.Get(core.ReplayedHeader) != "" {
		t.Errorf("first response carries %s", core.ReplayedHeader)
	}
	if got := replay.Header.Get(core.ReplayedHeader); got != "true" {
		t.Errorf("replay: %s = %q, want true", core.ReplayedHeader, got)
	}
	if replay.Status != first.Status {
		t.Errorf("replay status %d, first %d", replay.Status, first.Status)
	}
	if replay.Body != first.Body {
		t.Errorf("replay body %q, first %q", replay.Body, first.Body)
	}
	for _, h := range core.DefaultReplayHeaders() {
		if f, r := first.Header.Values(h), replay.Header.Values(h); strings.Join(f, "\n") != strings.Join(r, "\n") {
			t.Errorf("replay header %s = %q, first %q", h, r, f)
		}
	}
	if v := replay.Header.Values("Set-Cookie"); len(v) > 0 {
		t.Errorf("replay carries Set-Cookie %q", v)
	}
}

func TestNativeHandlers(t *testing.T) {
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
				if ct := first.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
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
					return c.Status(fiber.StatusCreated).Send(gzipped(`{"id":"p_1"}`))
				}
			},
			status: 201, body: string(gzipped(`{"id":"p_1"}`)), final: true,
			check: func(t *testing.T, first result) {
				if first.Header.Get("Content-Encoding") != "gzip" {
					t.Errorf("Content-Encoding %q", first.Header.Get("Content-Encoding"))
				}
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
				if first.Header.Get("Location") != "/v1/payments/p_1" || first.Header.Get("Set-Cookie") == "" {
					t.Errorf("first response headers %v", first.Header)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int64
			h := c.handler
			app := newApp()
			app.Post("/v1/payments", mw(newEngine(t, nil), fiberidem.WithScope(tenantScope)),
				func(ctx *fiber.Ctx) error { return h(runs.Add(1))(ctx) })
			url := serve(t, app) + "/v1/payments"
			cl := client(t, 0)
			send := func() result {
				return mustDo(t, cl, "POST", url, `{"amount":1000}`, "Idempotency-Key", "k-"+c.name, "X-Tenant", "t1")
			}
			first := send()
			if first.Status != c.status || first.Body != c.body {
				t.Fatalf("first: %d %q, want %d %q", first.Status, first.Body, c.status, c.body)
			}
			if c.check != nil {
				c.check(t, first)
			}
			second := send()
			if !c.final {
				if runs.Load() != 2 {
					t.Fatalf("handler ran %d times, want 2 (retryable)", runs.Load())
				}
				if second.Header.Get(core.ReplayedHeader) != "" || second.Status != c.status {
					t.Fatalf("retry: %d %v", second.Status, second.Header)
				}
				return
			}
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", runs.Load())
			}
			sameResponse(t, first, second)
			if second.Header.Get("X-Debug") != "" {
				t.Errorf("replay carries a header outside the allow-list")
			}
			// A different body under the same key is refused.
			mismatch := mustDo(t, cl, "POST", url, `{"amount":50000}`, "Idempotency-Key", "k-"+c.name, "X-Tenant", "t1")
			if mismatch.Status != http.StatusUnprocessableEntity {
				t.Errorf("mismatch: %d %s", mismatch.Status, mismatch.Body)
			}
			// Another tenant's same key is a new request.
			other := mustDo(t, cl, "POST", url, `{"amount":1000}`, "Idempotency-Key", "k-"+c.name, "X-Tenant", "t2")
			if other.Header.Get(core.ReplayedHeader) != "" || runs.Load() != 2 {
				t.Errorf("other tenant: replayed=%q runs=%d", other.Header.Get(core.ReplayedHeader), runs.Load())
			}
		})
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	const n = 100
	var runs atomic.Int64
	release := make(chan struct{})
	app := newApp()
	app.Post("/pay", mw(newEngine(t, nil)), func(c *fiber.Ctx) error {
		runs.Add(1)
		select {
		case <-release:
		case <-time.After(15 * time.Second):
		}
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
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			results[i] = r
			if answered.Add(1) == n-1 {
				close(allButOne)
			}
		}()
	}
	// The owner blocks until every duplicate has been answered, so all of
	// them arrive while it is in flight.
	select {
	case <-allButOne:
	case <-time.After(20 * time.Second):
		t.Error("duplicates were not answered while the first request was in flight")
	}
	close(release)
	wg.Wait()

	if got := runs.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	var created, conflict int
	for i, r := range results {
		switch r.Status {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
			conflict++
			if r.Header.Get("Retry-After") == "" || r.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("409 %d: headers %v", i, r.Header)
			}
		default:
			t.Errorf("response %d: %d %s", i, r.Status, r.Body)
		}
	}
	if created != 1 || conflict != n-1 {
		t.Fatalf("created %d, conflict %d", created, conflict)
	}
	replay := mustDo(t, cl, "POST", url, `{"amount":1}`, "Idempotency-Key", "dup")
	if replay.Status != http.StatusCreated || replay.Body != "charged once" || replay.Header.Get(core.ReplayedHeader) != "true" {
		t.Fatalf("replay after completion: %d %q %v", replay.Status, replay.Body, replay.Header)
	}
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
	app.Post("/pay", mw(newEngine(t, nil)), func(c *fiber.Ctx) error {
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
	if r.Status != http.StatusInternalServerError || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("panic answer: %d %v %s", r.Status, r.Header, r.Body)
	}
	var p core.Problem
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil || p.Type != core.ProblemBaseURI+core.ProblemHandlerPanic {
		t.Fatalf("problem %q: %v", r.Body, err)
	}
	if r.Header.Get("X-Handler") != "" || r.Header.Get("Set-Cookie") != "" {
		t.Errorf("the handler's headers went out with the problem: %v", r.Header)
	}
	if r.Header.Get("X-Request-ID") != "req-1" {
		t.Errorf("earlier middleware's header lost: %v", r.Header)
	}
	// The key is retryable: the retry runs the handler.
	r = mustDo(t, cl, "POST", url, "x", "Idempotency-Key", "p1")
	if r.Status != http.StatusCreated || r.Body != "ok" || runs.Load() != 2 {
		t.Fatalf("retry: %d %q runs=%d", r.Status, r.Body, runs.Load())
	}
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
			mw := mw(eng, fiberidem.WithScope(tenantScope))
			if mount == "use" {
				app.Use(mw)
				app.Add("POST", "/items/:id", handler)
				app.Add("PATCH", "/items/:id", handler)
			} else {
				app.Add("POST", "/items/:id", mw, handler)
				app.Add("PATCH", "/items/:id", mw, handler)
			}
			base := serve(t, app)
			cl := client(t, 1) // one connection: one fasthttp RequestCtx, reused

			bodyA := strings.Repeat("A", 100)
			sendA := func() result {
				return mustDo(t, cl, "POST", base+"/items/1", bodyA,
					"Idempotency-Key", "key-aaaa", "X-Tenant", "tenant-a", "X-Item", "aaaa")
			}
			first := sendA()
			if first.Status != 201 || first.Body != bodyA {
				t.Fatalf("first: %d %q", first.Status, first.Body)
			}
			for i := range 200 {
				// Same lengths and longer ones, so that fasthttp overwrites
				// in place and also grows its buffers.
				method := []string{"POST", "PATCH"}[i%2] // the last one is PATCH
				body := strings.Repeat(string(rune('B'+i%20)), 100+i%3*50)
				r := mustDo(t, cl, method, fmt.Sprintf("%s/items/%d", base, 2+i%3*10), body,
					"Idempotency-Key", fmt.Sprintf("key-%04d", i), "X-Tenant", fmt.Sprintf("tenant-%d", i%10),
					"X-Item", fmt.Sprintf("%04d", i))
				if r.Status != 201 || r.Body != body {
					t.Fatalf("request %d: %d %q", i, r.Status, r.Body)
				}
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
			if claim.Scope != "tenant-a" || claim.Key != "key-aaaa" || claim.Method != "POST" || claim.Route != wantRoute {
				t.Errorf("claim of A changed: %+v", claim)
			}
			if string(done.Body) != bodyA || done.Header.Get("Location") != "/items/aaaa" {
				t.Errorf("response of A changed: %q %v", done.Body, done.Header)
			}
			rec, err := mem.Get(context.Background(), "tenant-a", "key-aaaa")
			if err != nil {
				t.Fatalf("record of A: %v", err)
			}
			if rec.Method != "POST" || rec.Route != wantRoute || rec.Response == nil || string(rec.Response.Body) != bodyA {
				t.Errorf("record of A: method %q route %q response %+v", rec.Method, rec.Route, rec.Response)
			}
			mu.Lock()
			if keysSeen[bodyA] != "key-aaaa" {
				t.Errorf("key kept by the handler changed to %q", keysSeen[bodyA])
			}
			mu.Unlock()

			replay := sendA()
			sameResponse(t, first, replay)
			if replay.Header.Get("Location") != "/items/aaaa" {
				t.Errorf("replayed Location %q", replay.Header.Get("Location"))
			}
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
	app.Post("/pay", mw(newEngine(t, nil)), func(c *fiber.Ctx) error {
		inKey, _ = core.KeyFromContext(c.UserContext())
		relay = core.RelayKey(c.UserContext(), "charge")
		inOuter = c.UserContext().Value(ctxKey{}) == "outer"
		return c.SendStatus(fiber.StatusCreated)
	})
	url := serve(t, app) + "/pay"
	r := mustDo(t, client(t, 0), "POST", url, "", "Idempotency-Key", `"sf-key"`)
	if r.Status != 201 {
		t.Fatalf("status %d", r.Status)
	}
	if inKey != "sf-key" || relay == "" || !inOuter {
		t.Errorf("handler saw key %q relay %q outer value %v", inKey, relay, inOuter)
	}
	if afterHasKey || afterErr != nil || !outerValue {
		t.Errorf("outer middleware after the handler: lease %v, err %v, own value %v", afterHasKey, afterErr, outerValue)
	}
}

func TestMountedAppErrorHandler(t *testing.T) {
	var runs atomic.Int64
	sub := fiber.New(fiber.Config{ErrorHandler: func(c *fiber.Ctx, err error) error {
		return c.Status(fiber.StatusTeapot).JSON(fiber.Map{"error": err.Error()})
	}})
	sub.Post("/pay", mw(newEngine(t, nil)), func(*fiber.Ctx) error {
		runs.Add(1)
		return errors.New("declined")
	})
	app := newApp()
	app.Mount("/sub", sub)
	url := serve(t, app) + "/sub/pay"
	cl := client(t, 0)
	first := mustDo(t, cl, "POST", url, "{}", "Idempotency-Key", "e1")
	if first.Status != fiber.StatusTeapot || first.Body != `{"error":"declined"}` {
		t.Fatalf("first: %d %q", first.Status, first.Body)
	}
	sameResponse(t, first, mustDo(t, cl, "POST", url, "{}", "Idempotency-Key", "e1"))
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
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
			app.Post("/dl", mw(newEngine(t, nil, tc.opts...)), func(c *fiber.Ctx) error {
				runs.Add(1)
				return h(c)
			})
			url := serve(t, app) + "/dl"
			cl := client(t, 0)
			r := mustDo(t, cl, "POST", url, "", "Idempotency-Key", "s1")
			if r.Status != 200 || r.Body != tc.body {
				t.Fatalf("first: %d %q", r.Status, r.Body)
			}
			r = mustDo(t, cl, "POST", url, "", "Idempotency-Key", "s1")
			var p core.Problem
			_ = json.Unmarshal([]byte(r.Body), &p)
			if r.Status != http.StatusConflict || p.Type != core.ProblemBaseURI+core.ProblemNotRetained {
				t.Fatalf("retry: %d %s", r.Status, r.Body)
			}
			if runs.Load() != 1 {
				t.Fatalf("runs %d", runs.Load())
			}
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
		app.Post("/pay", mw(newEngine(t, &failingStore{Store: memstore.New(), claim: down})),
			func(c *fiber.Ctx) error { runs.Add(1); return c.SendString("ran") })
		r := mustDo(t, client(t, 0), "POST", serve(t, app)+"/pay", "", "Idempotency-Key", "f1")
		if r.Status != 503 || r.Header.Get("Content-Type") != "application/problem+json" || r.Header.Get("Retry-After") == "" || runs.Load() != 0 {
			t.Fatalf("%d %v %s runs=%d", r.Status, r.Header, r.Body, runs.Load())
		}
	})
	t.Run("claim-custom", func(t *testing.T) {
		var gotErr error
		var gotFallback *adapterkit.Response
		app := newApp()
		app.Post("/pay", mw(newEngine(t, &failingStore{Store: memstore.New(), claim: down}),
			fiberidem.WithErrorHandler(func(c *fiber.Ctx, err error, fallback *adapterkit.Response) error {
				gotErr, gotFallback = err, fallback
				return c.Status(fiber.StatusServiceUnavailable).SendString("try later")
			})),
			func(c *fiber.Ctx) error { return c.SendString("ran") })
		r := mustDo(t, client(t, 0), "POST", serve(t, app)+"/pay", "", "Idempotency-Key", "f1")
		if r.Status != 503 || r.Body != "try later" || !errors.Is(gotErr, down) || gotFallback == nil || gotFallback.Status != 503 {
			t.Fatalf("%d %q err=%v fallback=%+v", r.Status, r.Body, gotErr, gotFallback)
		}
	})
	t.Run("commit", func(t *testing.T) {
		app := newApp()
		app.Use(func(c *fiber.Ctx) error {
			c.Set("Access-Control-Allow-Origin", "*")
			return c.Next()
		})
		app.Post("/pay", mw(newEngine(t, &failingStore{Store: memstore.New(), complete: down})),
			func(c *fiber.Ctx) error {
				c.Set("Location", "/v1/payments/p_1")
				c.Cookie(&fiber.Cookie{Name: "sid", Value: "x"})
				return c.Status(fiber.StatusCreated).SendString("charged")
			})
		r := mustDo(t, client(t, 0), "POST", serve(t, app)+"/pay", "", "Idempotency-Key", "f1")
		if r.Status != 503 || r.Header.Get("Content-Type") != "application/problem+json" || strings.Contains(r.Body, "charged") {
			t.Fatalf("%d %v %s", r.Status, r.Header, r.Body)
		}
		if r.Header.Get("Location") != "" || r.Header.Get("Set-Cookie") != "" {
			t.Errorf("handler headers survived a failed commit: %v", r.Header)
		}
		if r.Header.Get("Access-Control-Allow-Origin") != "*" {
			t.Errorf("earlier middleware's header lost: %v", r.Header)
		}
	})
}

func TestOptions(t *testing.T) {
	var runs atomic.Int64
	h := func(c *fiber.Ctx) error { runs.Add(1); return c.SendString("ok") }
	app := newApp()
	eng := newEngine(t, nil)
	app.Post("/skip", mw(eng, fiberidem.WithSkip(func(c *fiber.Ctx) bool { return c.Get("X-Skip") == "1" })), h)
	app.Post("/scope", mw(eng, fiberidem.WithScope(func(*fiber.Ctx) (string, error) { return "", errors.New("no user") })), h)
	app.Post("/nil", mw(eng, nil, fiberidem.WithScope(nil), fiberidem.WithSkip(nil), fiberidem.WithRoute(nil), fiberidem.WithErrorHandler(nil)), h)
	app.Post("/route", mw(eng, fiberidem.WithRoute(func(*fiber.Ctx) string { return "custom" })), h)
	app.Get("/get", mw(eng), h)
	base := serve(t, app)
	cl := client(t, 0)

	if r := mustDo(t, cl, "POST", base+"/skip", "", "X-Skip", "1"); r.Status != 200 {
		t.Errorf("skip: %d %s", r.Status, r.Body)
	}
	if r := mustDo(t, cl, "POST", base+"/skip", ""); r.Status != 400 {
		t.Errorf("not skipped, no key: %d %s", r.Status, r.Body)
	}
	if r := mustDo(t, cl, "POST", base+"/scope", "", "Idempotency-Key", "k"); r.Status != 401 {
		t.Errorf("scope error: %d %s", r.Status, r.Body)
	}
	if r := mustDo(t, cl, "POST", base+"/scope", ""); r.Status != 400 {
		t.Errorf("scope not evaluated before the key check: %d %s", r.Status, r.Body)
	}
	if r := mustDo(t, cl, "POST", base+"/nil", "", "Idempotency-Key", "k"); r.Status != 200 {
		t.Errorf("nil options: %d %s", r.Status, r.Body)
	}
	if r := mustDo(t, cl, "POST", base+"/route", "", "Idempotency-Key", "k2"); r.Status != 200 {
		t.Errorf("custom route: %d %s", r.Status, r.Body)
	}
	if rec, err := eng.Store().Get(context.Background(), "", "k2"); err != nil || rec.Route != "custom" {
		t.Errorf("custom route record: %+v %v", rec, err)
	}
	if m, err := fiberidem.New(nil, fiberidem.WithScope(func(*fiber.Ctx) (string, error) { return "u", nil })); err == nil || m != nil {
		t.Errorf("New(nil) = %v, want an error", err)
	}
	if r := mustDo(t, cl, "GET", base+"/get", ""); r.Status != 200 {
		t.Errorf("GET bypass: %d %s", r.Status, r.Body)
	}
	if r := mustDo(t, cl, "POST", base+"/nil", "", "Idempotency-Key", "bad key with spaces"); r.Status != 400 {
		t.Errorf("invalid key: %d %s", r.Status, r.Body)
	}
}

// TestUseMountedRoutes: registered with app.Use or Group.Use, c.Route() is
// the middleware's prefix route, so the fingerprint uses the request path:
// one key on two endpoints is refused instead of replaying the wrong one.
func TestUseMountedRoutes(t *testing.T) {
	store := memstore.New()
	app := newApp()
	v1 := app.Group("/v1")
	v1.Use(mw(newEngine(t, store)))
	v1.Post("/payments", func(c *fiber.Ctx) error { return c.Status(201).SendString("payment") })
	v1.Post("/refunds", func(c *fiber.Ctx) error { return c.Status(201).SendString("refund") })
	base := serve(t, app)
	cl := client(t, 0)
	if r := mustDo(t, cl, "POST", base+"/v1/payments", "{}", "Idempotency-Key", "u1"); r.Status != 201 || r.Body != "payment" {
		t.Fatalf("payments: %d %q", r.Status, r.Body)
	}
	if r := mustDo(t, cl, "POST", base+"/v1/refunds", "{}", "Idempotency-Key", "u1"); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("same key on another route: %d %q", r.Status, r.Body)
	}
	if r := mustDo(t, cl, "POST", base+"/v1/payments", "{}", "Idempotency-Key", "u1"); r.Body != "payment" || r.Header.Get(core.ReplayedHeader) != "true" {
		t.Fatalf("replay: %d %q", r.Status, r.Body)
	}
	if rec, err := store.Get(context.Background(), "", "u1"); err != nil || rec.Route != "/v1/payments" {
		t.Fatalf("record route %q: %v", rec.Route, err)
	}
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
	app.Post("/pay", mw(eng), func(c *fiber.Ctx) error {
		return c.Status(fiber.StatusCreated).SendString("paid")
	})
	base := serve(t, app)
	cl := client(t, 1)
	for i := range 3 {
		r := mustDo(t, cl, "POST", base+"/pay", "{}", "Idempotency-Key", "edit-1")
		if r.Status != fiber.StatusCreated || r.Body != "PAID" {
			t.Fatalf("request %d: %d %q", i, r.Status, r.Body)
		}
	}
	rec, err := eng.Store().Get(context.Background(), "", "edit-1")
	if err != nil || rec.Response == nil || string(rec.Response.Body) != "paid" { // recorded before the edit
		t.Fatalf("stored: %+v %v", rec.Response, err)
	}
}
