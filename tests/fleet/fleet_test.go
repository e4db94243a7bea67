package fleet

import (
	"bytes"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	fiberv3 "github.com/gofiber/fiber/v3"
	"github.com/labstack/echo/v4"
	echov5 "github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/echov5idem"
	"github.com/idemkit/idem/fiberidem"
	"github.com/idemkit/idem/fiberv3idem"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

const userHeader = "X-User-ID"

// app is the business logic every framework serves the same way: it counts
// executions and, for a request carrying X-Block, waits for release.
type app struct {
	runs    atomic.Int64
	entered chan string // the framework that entered a blocked handler
	release chan struct{}
}

// answer is the response every framework writes for one execution:
// identical bytes whatever the framework, so a replay through another
// framework is comparable byte for byte with a fresh answer.
func (a *app) answer(framework, path string, block bool) (int, string, string, []byte) {
	n := a.runs.Add(1)
	if block {
		a.entered <- framework
		select {
		case <-a.release:
		case <-time.After(15 * time.Second):
		}
	}
	body := fmt.Sprintf(`{"run":%d,"served_by":%q,"path":%q}`, n, framework, path)
	return http.StatusCreated, "application/json", fmt.Sprintf("/v1/runs/%d", n), []byte(body)
}

// server is one framework's instance of the fleet.
type server struct {
	name string
	base string
}

func serveNetHTTP(t *testing.T, eng *core.Engine, a *app) server {
	mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) { return r.Header.Get(userHeader), nil }))
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		status, ct, loc, body := a.answer("nethttp", r.URL.Path, r.Header.Get("X-Block") != "")
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Location", loc)
		w.WriteHeader(status)
		_, _ = w.Write(body)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(h))
	mux.Handle("POST /v1/orders/{id}/confirm", mw(h))
	mux.Handle("POST /v1/files/{path...}", mw(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return server{"nethttp", srv.URL}
}

func serveGin(t *testing.T, eng *core.Engine, a *app) server {
	mw, err := ginidem.New(eng, ginidem.WithScope(func(c *gin.Context) (string, error) { return c.GetHeader(userHeader), nil }))
	if err != nil {
		t.Fatal(err)
	}
	h := func(c *gin.Context) {
		_, _ = io.ReadAll(c.Request.Body)
		status, ct, loc, body := a.answer("gin", c.Request.URL.Path, c.GetHeader("X-Block") != "")
		c.Header("Location", loc)
		c.Data(status, ct, body)
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/v1/payments", mw, h)
	r.POST("/v1/orders/:id/confirm", mw, h)
	r.POST("/v1/files/*path", mw, h)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return server{"gin", srv.URL}
}

func serveEcho(t *testing.T, eng *core.Engine, a *app) server {
	mw, err := echoidem.New(eng, echoidem.WithScope(func(c echo.Context) (string, error) { return c.Request().Header.Get(userHeader), nil }))
	if err != nil {
		t.Fatal(err)
	}
	h := func(c echo.Context) error {
		_, _ = io.ReadAll(c.Request().Body)
		status, ct, loc, body := a.answer("echo", c.Request().URL.Path, c.Request().Header.Get("X-Block") != "")
		c.Response().Header().Set("Location", loc)
		return c.Blob(status, ct, body)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.POST("/v1/payments", h, mw)
	e.POST("/v1/orders/:id/confirm", h, mw)
	e.POST("/v1/files/*", h, mw)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return server{"echo", srv.URL}
}

func serveEchoV5(t *testing.T, eng *core.Engine, a *app) server {
	mw, err := echov5idem.New(eng, echov5idem.WithScope(func(c *echov5.Context) (string, error) { return c.Request().Header.Get(userHeader), nil }))
	if err != nil {
		t.Fatal(err)
	}
	h := func(c *echov5.Context) error {
		_, _ = io.ReadAll(c.Request().Body)
		status, ct, loc, body := a.answer("echov5", c.Request().URL.Path, c.Request().Header.Get("X-Block") != "")
		c.Response().Header().Set("Location", loc)
		return c.Blob(status, ct, body)
	}
	e := echov5.New()
	e.Use(mw) // globally, as echo teaches: unknown routes pass through
	e.POST("/v1/payments", h)
	e.POST("/v1/orders/:id/confirm", h)
	e.POST("/v1/files/*", h)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return server{"echov5", srv.URL}
}

func serveFiber(t *testing.T, eng *core.Engine, a *app) server {
	mw, err := fiberidem.New(eng, fiberidem.WithScope(func(c *fiber.Ctx) (string, error) { return c.Get(userHeader), nil }))
	if err != nil {
		t.Fatal(err)
	}
	h := func(c *fiber.Ctx) error {
		status, ct, loc, body := a.answer("fiber", c.Path(), c.Get("X-Block") != "")
		c.Set("Content-Type", ct)
		c.Set("Location", loc)
		return c.Status(status).Send(body)
	}
	f := fiber.New(fiber.Config{DisableStartupMessage: true, ReadTimeout: 5 * time.Second})
	f.Post("/v1/payments", mw, h)
	f.Post("/v1/orders/:id/confirm", mw, h)
	f.Post("/v1/files/*", mw, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Listener(ln) }()
	t.Cleanup(func() {
		if err := f.ShutdownWithTimeout(10 * time.Second); err != nil {
			t.Errorf("fiber shutdown: %v", err)
		}
		<-done
	})
	return server{"fiber", "http://" + ln.Addr().String()}
}

func serveFiberV3(t *testing.T, eng *core.Engine, a *app) server {
	mw, err := fiberv3idem.New(eng, fiberv3idem.WithScope(func(c fiberv3.Ctx) (string, error) { return c.Get(userHeader), nil }))
	if err != nil {
		t.Fatal(err)
	}
	h := func(c fiberv3.Ctx) error {
		status, ct, loc, body := a.answer("fiberv3", c.Path(), c.Get("X-Block") != "")
		c.Set("Content-Type", ct)
		c.Set("Location", loc)
		return c.Status(status).Send(body)
	}
	f := fiberv3.New(fiberv3.Config{ReadTimeout: 5 * time.Second})
	f.Post("/v1/payments", mw, h)
	f.Post("/v1/orders/:id/confirm", mw, h)
	f.Post("/v1/files/*", mw, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Listener(ln, fiberv3.ListenConfig{DisableStartupMessage: true}) }()
	t.Cleanup(func() {
		if err := f.ShutdownWithTimeout(10 * time.Second); err != nil {
			t.Errorf("fiber v3 shutdown: %v", err)
		}
		<-done
	})
	return server{"fiberv3", "http://" + ln.Addr().String()}
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, c *http.Client, base, path, user, key, body string, hdr ...string) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(userHeader, user)
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("POST %s%s: %v", base, path, err)
		return result{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("read %s%s: %v", base, path, err)
	}
	return result{resp.StatusCode, resp.Header, b}
}

// sameAnswer checks that replay is first, replayed: status, body byte for
// byte, and the allow-listed headers the handler set.
func sameAnswer(t *testing.T, what string, first, replay result) {
	t.Helper()
	if replay.status != first.status || !bytes.Equal(replay.body, first.body) {
		t.Errorf("%s: replay %d %s, want %d %s", what, replay.status, replay.body, first.status, first.body)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if got, want := replay.header.Get(h), first.header.Get(h); got != want {
			t.Errorf("%s: replay %s %q, want %q", what, h, got, want)
		}
	}
	if replay.header.Get(core.ReplayedHeader) != "true" {
		t.Errorf("%s: not marked replayed: %d %s", what, replay.status, replay.body)
	}
}

// adapters start one instance of each adapter, in the fleet tests.
var adapters = []func(*testing.T, *core.Engine, *app) server{serveNetHTTP, serveGin, serveEcho, serveEchoV5, serveFiber, serveFiberV3}

// TestFleet: the six adapters (echo and fiber each in two majors), each with its own
// engine as separate instances would have, on one PostgreSQL schema,
// serving a static route, one with a path parameter and a catch-all,
// registered in each framework's syntax.
func TestFleet(t *testing.T) {
	store, _ := pgstores.Store(t)
	a := &app{entered: make(chan string, len(adapters)), release: make(chan struct{})}
	var servers []server
	for _, serve := range adapters {
		eng, err := core.New(store, core.WithLease(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, serve(t, eng, a))
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	paths := []string{"/v1/payments", "/v1/orders/42/confirm", "/v1/files/a/b.txt"}
	const body = `{"amount":1000,"currency":"JPY"}`

	// A key first served by each adapter replays through each of the others.
	for _, first := range servers {
		for _, path := range paths {
			key := "fleet-" + first.name + strings.ReplaceAll(path, "/", "-")
			before := a.runs.Load()
			r := post(t, c, first.base, path, "alice", key, body)
			if r.status != http.StatusCreated || r.header.Get(core.ReplayedHeader) != "" {
				t.Fatalf("%s %s first: %d %s", first.name, path, r.status, r.body)
			}
			for _, other := range servers {
				sameAnswer(t, fmt.Sprintf("%s -> %s %s", first.name, other.name, path), r,
					post(t, c, other.base, path, "alice", key, body))
			}
			if ran := a.runs.Load() - before; ran != 1 {
				t.Errorf("%s %s: the handler ran %d times across the fleet, want 1", first.name, path, ran)
			}
			// The same key with another body is a mismatch everywhere.
			for _, other := range servers {
				if m := post(t, c, other.base, path, "alice", key, `{"amount":5}`); m.status != http.StatusUnprocessableEntity {
					t.Errorf("%s -> %s %s other body: %d %s, want 422", first.name, other.name, path, m.status, m.body)
				}
			}
		}
	}

	// An in-flight duplicate through another adapter: 409, never 422; once
	// the first finishes, every adapter replays it.
	for _, first := range servers {
		path := paths[1]
		key := "fleet-inflight-" + first.name
		var wg sync.WaitGroup
		var r result
		wg.Add(1)
		go func() {
			defer wg.Done()
			r = post(t, c, first.base, path, "bob", key, body, "X-Block", "1")
		}()
		select {
		case <-a.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: blocked handler never started", first.name)
		}
		for _, other := range servers {
			if other.name == first.name {
				continue
			}
			d := post(t, c, other.base, path, "bob", key, body)
			if d.status != http.StatusConflict || !bytes.Contains(d.body, []byte(problem.InFlight)) {
				t.Errorf("in flight on %s, duplicate via %s: %d %s, want 409 in-flight", first.name, other.name, d.status, d.body)
			}
		}
		a.release <- struct{}{}
		wg.Wait()
		if r.status != http.StatusCreated {
			t.Fatalf("%s blocked first: %d %s", first.name, r.status, r.body)
		}
		for _, other := range servers {
			sameAnswer(t, fmt.Sprintf("in-flight %s -> %s", first.name, other.name), r, post(t, c, other.base, path, "bob", key, body))
		}
	}
}
