package ginidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/ginidem"
)

// The helpers the store-backed tests need; ginidem's own tests (memstore)
// live beside the adapter, in ginidem/.

const payBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

func newEngineOn(tb testing.TB, s core.Store, opts ...core.Option) *core.Engine {
	tb.Helper()
	eng, err := core.New(s, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	require.NoError(tb, err, "core.New")
	return eng
}

// mw builds the middleware, failing the test on a construction error.
func mw(tb testing.TB, eng *core.Engine, opts ...ginidem.Option) gin.HandlerFunc {
	tb.Helper()
	m, err := ginidem.New(eng, opts...)
	require.NoError(tb, err, "ginidem.New")
	return m
}

// req describes one request served in-process.
type req struct {
	method, path, key, body string
	header                  map[string]string
}

// response is a response read in full.
type response struct {
	status int
	header http.Header
	body   []byte
}

// serve runs r through h in-process. Safe from any goroutine.
func serve(h http.Handler, r req) *response {
	if r.method == "" {
		r.method = http.MethodPost
	}
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	hr := httptest.NewRequest(r.method, r.path, body)
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, hr)
	res := rr.Result()
	b, _ := io.ReadAll(res.Body)
	return &response{status: res.StatusCode, header: res.Header, body: b}
}

// checkReplay checks that replay is first byte for byte (status, body,
// allow-listed headers, Content-Length) plus Idempotent-Replayed: true, and
// that no Set-Cookie is replayed.
func checkReplay(t *testing.T, first, replay *response) {
	t.Helper()
	assert.Equal(t, first.status, replay.status, "replay status")
	assert.Equal(t, string(first.body), string(replay.body), "replay body")
	for _, h := range append([]string{"Content-Length"}, core.DefaultReplayHeaders()...) {
		assert.Equal(t, first.header.Values(h), replay.header.Values(h), "replay header %s", h)
	}
	assert.Equal(t, "true", replay.header.Get(core.ReplayedHeader), "replay %s", core.ReplayedHeader)
	assert.Empty(t, first.header.Get(core.ReplayedHeader), "first response carries %s", core.ReplayedHeader)
	assert.Empty(t, replay.header.Values("Set-Cookie"), "replay carries Set-Cookie")
}
