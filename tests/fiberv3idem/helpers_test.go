package fiberv3idem_test

import (
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
	"github.com/idemkit/idem/fiberv3idem"
)

// The helpers the store-backed tests need; fiberv3idem's own tests
// (memstore) live beside the adapter, in fiberv3idem/.

func newEngine(tb testing.TB, store core.Store, opts ...core.Option) *core.Engine {
	tb.Helper()
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

func newApp() *fiber.App {
	app := fiber.New()
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
// test ends (goleak).
func client(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 100, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

type result struct {
	Status int
	Header http.Header
	Body   string
}

// mustDo sends one request, failing the test on a transport error; headers
// are name, value pairs. Call it from the test's goroutine only.
func mustDo(t *testing.T, c *http.Client, method, url, body string, headers ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	require.NoError(t, err, "%s %s", method, url)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "%s %s: body", method, url)
	return result{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
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
