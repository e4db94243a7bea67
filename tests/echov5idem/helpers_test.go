package echov5idem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echov5idem"
)

// newEngine is an engine on a fresh memstore with one shared key space
// (no scope function needed), and the store to inspect.
func newEngine(t *testing.T) (*core.Engine, *memstore.Store) {
	t.Helper()
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	return eng, store
}

// mw builds the middleware, failing the test on a construction error.
func mw(t *testing.T, eng *core.Engine, opts ...echov5idem.Option) echo.MiddlewareFunc {
	t.Helper()
	m, err := echov5idem.New(eng, opts...)
	if err != nil {
		t.Fatal(err)
	}
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

var _ http.Handler = (*echo.Echo)(nil)
