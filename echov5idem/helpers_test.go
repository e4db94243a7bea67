package echov5idem_test

import (
	"io"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echov5idem"
)

// newEngine is an engine on a fresh memstore with one shared key space
// (no scope function needed), and the store to inspect.
func newEngine(tb testing.TB) (*core.Engine, *memstore.Store) {
	tb.Helper()
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	require.NoError(tb, err, "core.New")
	return eng, store
}

// mw builds the middleware, failing the test on a construction error.
func mw(tb testing.TB, eng *core.Engine, opts ...echov5idem.Option) echo.MiddlewareFunc {
	tb.Helper()
	m, err := echov5idem.New(eng, opts...)
	require.NoError(tb, err, "echov5idem.New")
	return m
}

// serve runs one request through e (no network) and returns the recorder.
func serve(e *echo.Echo, method, path, key string, body io.Reader) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, body)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	e.ServeHTTP(w, req)
	return w
}

func replayed(w *httptest.ResponseRecorder) bool {
	return w.Header().Get(core.ReplayedHeader) == "true"
}
