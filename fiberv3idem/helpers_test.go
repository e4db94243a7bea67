package fiberv3idem_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberv3idem"
	"github.com/idemkit/idem/fiberv3idem/fiberv3idemtest"
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

// The app, listener, client, request and replay check are
// fiberv3idemtest's, shared with the adapter's conformance run and
// tests/fiberv3idem.
var (
	newApp       = fiberv3idemtest.NewApp
	serve        = fiberv3idemtest.Serve
	client       = fiberv3idemtest.Client
	do           = fiberv3idemtest.Do
	sameResponse = fiberv3idemtest.SameResponse
)

type result = fiberv3idemtest.Result

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
