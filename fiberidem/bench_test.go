package fiberidem_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

const benchBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

func benchHandler(c *fiber.Ctx) error {
	return c.Status(fiber.StatusCreated).JSON(fiber.Map{"id": "pay_1", "amount": 1000, "currency": "JPY", "to": "alice"})
}

// benchKeys are 36 characters long: the only length fiber's idempotency
// middleware accepts by default (a UUID's).
func benchKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%08x-0000-4000-8000-000000000000", i)
	}
	return keys
}

// benchServer calls the app's fasthttp handler in process, with one
// RequestCtx reused as a keep-alive connection would: no network, no
// parsing, only fiber's routing and the middleware under test.
type benchServer struct {
	h   fasthttp.RequestHandler
	ctx fasthttp.RequestCtx
}

func newBenchServer(mw ...fiber.Handler) *benchServer {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/v1/payments", append(mw, benchHandler)...)
	s := &benchServer{h: app.Handler()}
	var req fasthttp.Request
	req.Header.SetMethod(fiber.MethodPost)
	req.SetRequestURI("/v1/payments")
	req.Header.SetContentType(fiber.MIMEApplicationJSON)
	req.SetBodyString(benchBody)
	s.ctx.Init(&req, nil, nil)
	return s
}

func (s *benchServer) serve(b *testing.B, key []byte) {
	s.ctx.Response.Reset()
	if key != nil {
		s.ctx.Request.Header.SetBytesV("Idempotency-Key", key)
	}
	s.h(&s.ctx)
	// A plain check, not testify: this runs inside the timed loop.
	if s.ctx.Response.StatusCode() != fiber.StatusCreated {
		b.Fatalf("status %d: %s", s.ctx.Response.StatusCode(), s.ctx.Response.Body())
	}
}

// loop runs op b.Loop() times and reports, besides wall time, the process
// CPU time per operation (cpu-ns/op), which other load on the machine
// disturbs much less.
func loop(b *testing.B, op func()) {
	b.ReportAllocs()
	start := processCPU()
	n := 0
	for b.Loop() {
		op()
		n++
	}
	if end := processCPU(); start >= 0 && end >= 0 && n > 0 {
		b.ReportMetric(float64(end-start)/float64(n), "cpu-ns/op")
	}
}

// firstExecutions serves a fresh key every iteration. Every 1<<16 keys the
// server (and its store) is rebuilt outside the timer, so that neither
// store's growth dominates.
func firstExecutions(b *testing.B, newServer func() *benchServer) {
	keys := benchKeys(1 << 16)
	s := newServer()
	i := 0
	loop(b, func() {
		if i == len(keys) {
			b.StopTimer()
			s, i = newServer(), 0
			b.StartTimer()
		}
		s.serve(b, keys[i])
		i++
	})
}

func replays(b *testing.B, s *benchServer) {
	key := benchKeys(1)[0]
	s.serve(b, key)
	loop(b, func() { s.serve(b, key) })
}

func benchEngine(b *testing.B) *core.Engine {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	require.NoError(b, err)
	return eng
}

func fiberIdempotency() fiber.Handler {
	// Fiber's built-in middleware with its default in-memory storage and
	// lock; only the header name is set to the one idem reads.
	return idempotency.New(idempotency.Config{KeyHeader: "Idempotency-Key"})
}

// BenchmarkMiddleware compares, in one run, a bare Fiber handler with the
// same handler behind fiberidem (memstore), behind Fiber's own
// middleware/idempotency (default in-memory storage), and behind a naive
// cache middleware (check, run, store; no claim), each for a first
// execution (fresh key) and a replay (one stored key).
func BenchmarkMiddleware(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		s := newBenchServer()
		loop(b, func() { s.serve(b, nil) })
	})
	b.Run("fiberidem-first", func(b *testing.B) {
		firstExecutions(b, func() *benchServer { return newBenchServer(mw(b, benchEngine(b))) })
	})
	b.Run("fiberidem-replay", func(b *testing.B) {
		replays(b, newBenchServer(mw(b, benchEngine(b))))
	})
	// The engine alone (Decide, Context, Commit on memstore, no Fiber), with
	// the request and response the adapter would hand it: what the adapter
	// cannot do anything about.
	b.Run("core-only-first", func(b *testing.B) {
		keys := benchKeys(1 << 16)
		eng := benchEngine(b)
		i := 0
		loop(b, func() {
			if i == len(keys) {
				b.StopTimer()
				eng, i = benchEngine(b), 0
				b.StartTimer()
			}
			coreRoundTrip(b, eng, keys[i], core.Proceed)
			i++
		})
	})
	b.Run("core-only-replay", func(b *testing.B) {
		eng := benchEngine(b)
		key := benchKeys(1)[0]
		coreRoundTrip(b, eng, key, core.Proceed)
		loop(b, func() { coreRoundTrip(b, eng, key, core.Replay) })
	})
	b.Run("fiber-idempotency-first", func(b *testing.B) {
		firstExecutions(b, func() *benchServer { return newBenchServer(fiberIdempotency()) })
	})
	b.Run("fiber-idempotency-replay", func(b *testing.B) {
		replays(b, newBenchServer(fiberIdempotency()))
	})
	// What any replay costs before a middleware does anything: fiber's
	// dispatch and writing a stored response (status, Content-Type, body),
	// with no lookup at all. Each middleware's replay minus this is its own
	// work.
	b.Run("write-only-replay", func(b *testing.B) {
		body := []byte(`{"amount":1000,"currency":"JPY","id":"pay_1","to":"alice"}`)
		s := newBenchServer(func(c *fiber.Ctx) error {
			c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
			return c.Status(fiber.StatusCreated).Send(body)
		})
		key := benchKeys(1)[0]
		loop(b, func() { s.serve(b, key) })
	})
	b.Run("naive-cache-first", func(b *testing.B) {
		firstExecutions(b, func() *benchServer { return newBenchServer(naiveCache()) })
	})
	b.Run("naive-cache-replay", func(b *testing.B) {
		replays(b, newBenchServer(naiveCache()))
	})
}

// naiveCache is the "cache the response" middleware idem exists to
// replace: look the key up, else run the handler and store its response.
// Two requests with one key in flight both run the handler.
func naiveCache() fiber.Handler {
	type entry struct {
		status      int
		contentType string
		body        []byte
	}
	var mu sync.Mutex
	cache := map[string]entry{}
	return func(c *fiber.Ctx) error {
		key := c.Get("Idempotency-Key")
		if key == "" {
			return c.Next()
		}
		mu.Lock()
		e, ok := cache[key]
		mu.Unlock()
		if ok {
			c.Set(fiber.HeaderContentType, e.contentType)
			return c.Status(e.status).Send(e.body)
		}
		if err := c.Next(); err != nil {
			return err
		}
		r := c.Response()
		e = entry{status: r.StatusCode(), contentType: string(r.Header.ContentType()), body: bytes.Clone(r.Body())}
		mu.Lock()
		cache[string(key)] = e // string(key): copied out of fasthttp's buffer
		mu.Unlock()
		return nil
	}
}

var (
	benchRespBody   = []byte(`{"amount":1000,"currency":"JPY","id":"pay_1","to":"alice"}`)
	benchRespHeader = http.Header{"Content-Type": {"application/json"}}
)

// coreRoundTrip is what fiberidem asks of the engine for one request: the
// same headers as the in-process requests above, the body, and for a first
// execution the handler's response. Its checks are plain, not testify:
// they run inside the timed loop.
func coreRoundTrip(b *testing.B, eng *core.Engine, key []byte, want core.Outcome) {
	h := http.Header{
		"Host":            {"example.com"},
		"Content-Type":    {"application/json"},
		"Content-Length":  {"45"},
		"Idempotency-Key": {string(key)},
	}
	ctx := context.Background()
	d, err := eng.Decide(ctx, core.Request{Method: "POST", Route: "/v1/payments", Header: h, Body: bytes.NewReader([]byte(benchBody))})
	if err != nil || d.Outcome != want {
		b.Fatalf("decide: %v %v", d.Outcome, err)
	}
	if want != core.Proceed {
		return
	}
	if err := eng.Commit(d.Context(ctx), d, adapterkit.Response{Status: 201, Header: benchRespHeader, Body: bytes.Clone(benchRespBody)}); err != nil {
		b.Fatal(err)
	}
}
