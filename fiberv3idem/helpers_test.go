package fiberv3idem_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberv3idem"
)

// newEngine builds an engine on store (memstore when nil) with one key
// space for every caller.
func newEngine(tb testing.TB, store core.Store, opts ...core.Option) *core.Engine {
	tb.Helper()
	if store == nil {
		store = memstore.New()
	}
	eng, err := core.New(store, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	require.NoError(tb, err, "core.New")
	return eng
}

// mw builds the middleware, failing the test on a construction error.
func mw(tb testing.TB, eng *core.Engine, opts ...fiberv3idem.Option) fiber.Handler {
	tb.Helper()
	m, err := fiberv3idem.New(eng, opts...)
	require.NoError(tb, err, "fiberv3idem.New")
	return m
}

func tenantScope(c fiber.Ctx) (string, error) {
	// c.Get aliases fasthttp's buffer; fiberv3idem copies what it keeps.
	return c.Get("X-Tenant"), nil
}

// serve runs app on a real listener on 127.0.0.1 and shuts it down (waiting
// for Listener to return) when the test ends.
func serve(t *testing.T, app *fiber.App) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true})
	}()
	t.Cleanup(func() {
		assert.NoError(t, app.ShutdownWithTimeout(10*time.Second), "shutdown")
		<-done
	})
	return "http://" + ln.Addr().String()
}

func newApp(cfg ...fiber.Config) *fiber.App {
	app := fiber.New(cfg...)
	quickStop(app)
	return app
}

// quickStop makes fasthttp's worker-pool cleaner, which only checks for
// shutdown between sleeps of MaxIdleWorkerDuration (default 10s), exit
// promptly after Shutdown, so that goleak sees it gone.
func quickStop(app *fiber.App) {
	app.Server().MaxIdleWorkerDuration = 50 * time.Millisecond
}

// client returns an HTTP client whose idle connections are closed when the
// test ends (goleak). maxConns > 0 limits it to that many connections, so
// that requests reuse one fasthttp connection (and its buffers).
func client(t *testing.T, maxConns int) *http.Client {
	tr := &http.Transport{MaxConnsPerHost: maxConns, MaxIdleConnsPerHost: 100, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

type result struct {
	Status int
	Header http.Header
	Body   string
}

// do sends one request; headers are name, value pairs. It never fails the
// test, so goroutines may use it.
func do(c *http.Client, method, url, body string, headers ...string) (result, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

// mustDo is do that fails the test on a transport error: call it from the
// test's goroutine only.
func mustDo(t *testing.T, c *http.Client, method, url, body string, headers ...string) result {
	t.Helper()
	r, err := do(c, method, url, body, headers...)
	require.NoError(t, err, "%s %s", method, url)
	return r
}

// test sends req through app.Test (no listener) and returns the status and
// body.
func test(t *testing.T, app *fiber.App, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := app.Test(req, fiber.TestConfig{Timeout: 0})
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, resp.Header, string(b)
}

// sameResponse checks that a replay is the first response again: status,
// body and every allow-listed header, plus Idempotent-Replayed: true, and
// never Set-Cookie.
func sameResponse(t *testing.T, first, replay result) {
	t.Helper()
	assert.Empty(t, first.Header.Get(core.ReplayedHeader), "first response carries %s", core.ReplayedHeader)
	assert.Equal(t, "true", replay.Header.Get(core.ReplayedHeader), "replay %s", core.ReplayedHeader)
	assert.Equal(t, first.Status, replay.Status, "replay status")
	assert.Equal(t, first.Body, replay.Body, "replay body")
	for _, h := range core.DefaultReplayHeaders() {
		assert.Equal(t, strings.Join(first.Header.Values(h), "\n"), strings.Join(replay.Header.Values(h), "\n"), "replay header %s", h)
	}
	assert.Empty(t, replay.Header.Values("Set-Cookie"), "replay carries Set-Cookie")
}

func gzipped(t *testing.T, p []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	require.NoError(t, err)
	_, err = zw.Write(p)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}
