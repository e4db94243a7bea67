package fiberidemtest

import (
	"github.com/idemkit/idem/core/idemtest"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/idemkit/idem/core"
)

// NewApp returns a Fiber app for a test, configured by cfg (at most one;
// none is fiber's defaults) without the startup message. fasthttp's
// worker-pool cleaner, which only checks for shutdown between sleeps of
// MaxIdleWorkerDuration (default 10s), exits promptly after Shutdown, so
// that goleak sees it gone.
func NewApp(cfg ...fiber.Config) *fiber.App {
	c := fiber.Config{}
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.DisableStartupMessage = true
	app := fiber.New(c)
	app.Server().MaxIdleWorkerDuration = 50 * time.Millisecond
	return app
}

// Serve runs app on a real listener on 127.0.0.1, shut down (waiting for
// Listener to return) when the test ends, and returns its base URL.
func Serve(tb testing.TB, app *fiber.App) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = app.Listener(ln)
	}()
	tb.Cleanup(func() {
		if err := app.ShutdownWithTimeout(20 * time.Second); err != nil {
			tb.Errorf("fiber shutdown: %v", err)
		}
		<-done
	})
	return "http://" + ln.Addr().String()
}

// Client returns an HTTP client whose idle connections are closed when the
// test ends (goleak). maxConns > 0 limits it to that many connections, so
// that requests reuse one fasthttp connection (and its buffers).
func Client(tb testing.TB, maxConns int) *http.Client {
	tr := &http.Transport{MaxConnsPerHost: maxConns, MaxIdleConnsPerHost: 100, DisableCompression: true}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// Result is a response read in full.
type Result struct {
	Status int
	Header http.Header
	Body   string
}

// Do sends one request with c; headers are name, value pairs. It never
// fails the test, so goroutines may use it.
func Do(c *http.Client, method, url, body string, headers ...string) (Result, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return Result{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Result{}, err
	}
	return Result{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

// SameResponse checks that replay is the first response again: status,
// body and every allow-listed header, plus Idempotent-Replayed: true, and
// never Set-Cookie.
func SameResponse(tb testing.TB, first, replay Result) {
	tb.Helper()
	if v := first.Header.Get(core.ReplayedHeader); v != "" {
		tb.Errorf("first response carries %s: %q", core.ReplayedHeader, v)
	}
	if v := replay.Header.Get(core.ReplayedHeader); v != "true" {
		tb.Errorf("replay %s: %q, want \"true\"", core.ReplayedHeader, v)
	}
	if replay.Status != first.Status {
		tb.Errorf("replay status %d, first %d", replay.Status, first.Status)
	}
	if replay.Body != first.Body {
		tb.Errorf("replay body %q, first %q", replay.Body, first.Body)
	}
	for _, h := range idemtest.ReplayHeaders() {
		if a, b := strings.Join(first.Header.Values(h), "\n"), strings.Join(replay.Header.Values(h), "\n"); a != b {
			tb.Errorf("replay header %s: %q, first %q", h, b, a)
		}
	}
	if v := replay.Header.Values("Set-Cookie"); len(v) > 0 {
		tb.Errorf("replay carries Set-Cookie: %q", v)
	}
}
