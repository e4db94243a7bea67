package echoidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echoidem"
)

// The helpers the store-backed tests need; echoidem's own tests (memstore)
// live beside the adapter, in echoidem/.

// mw builds the middleware, panicking on a construction error (tests only).
func mw(eng *core.Engine, opts ...echoidem.Option) echo.MiddlewareFunc {
	m, err := echoidem.New(eng, opts...)
	if err != nil {
		panic(err)
	}
	return m
}

// server is one test's Echo app behind a real listener, with its own client.
type server struct {
	t      *testing.T
	e      *echo.Echo
	eng    *core.Engine
	url    string
	client *http.Client
}

// newServer builds an engine on store and an Echo app; routes are added by
// the caller before start.
func newServer(t *testing.T, store core.Store) *server {
	t.Helper()
	eng, err := core.New(store, core.WithSharedKeySpace())
	require.NoError(t, err, "core.New")
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	return &server{t: t, e: e, eng: eng}
}

func (s *server) start() {
	srv := httptest.NewServer(s.e)
	tr := &http.Transport{}
	s.client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	s.url = srv.URL
	s.t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func (r *result) String() string { return fmt.Sprintf("%d %q %v", r.status, r.body, r.header) }

// do sends one request (hdr: name, value pairs) and reads the response in
// full; for the test goroutine.
func (s *server) do(method, path, key, body string, hdr ...string) *result {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	require.NoError(s.t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.client.Do(req)
	require.NoError(s.t, err, "%s %s", method, path)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err, "%s %s", method, path)
	return &result{status: resp.StatusCode, header: resp.Header, body: b}
}

func isReplay(r *result) bool { return r.header.Get(core.ReplayedHeader) == "true" }

// sameAsFirst checks a replay against the first response: status, body
// byte for byte, every allow-listed header, the replay marker, and no
// Set-Cookie.
func sameAsFirst(t *testing.T, first, replay *result) {
	t.Helper()
	assert.False(t, isReplay(first), "first response is marked replayed: %v", first)
	assert.True(t, isReplay(replay), "replay is not marked %s: true: %v", core.ReplayedHeader, replay)
	assert.Equal(t, first.status, replay.status, "replay status")
	assert.Equal(t, string(first.body), string(replay.body), "replay body")
	for _, h := range append([]string{"Content-Length"}, core.DefaultReplayHeaders()...) {
		assert.Equal(t, first.header.Values(h), replay.header.Values(h), "replay header %s", h)
	}
	assert.Empty(t, replay.header.Values("Set-Cookie"), "replay carries Set-Cookie")
}
