package echoidem_test

import (
	"encoding/json"
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
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echoidem"
)

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
	store  core.Store
	url    string
	client *http.Client
}

// newServer builds an engine on store (memstore when nil) and an Echo app;
// routes are added by the caller before start.
func newServer(t *testing.T, store core.Store, engOpts ...core.Option) *server {
	t.Helper()
	if store == nil {
		store = memstore.New()
	}
	eng, err := core.New(store, append([]core.Option{core.WithSharedKeySpace()}, engOpts...)...)
	require.NoError(t, err, "core.New")
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	return &server{t: t, e: e, eng: eng, store: store}
}

func (s *server) start() {
	srv := httptest.NewServer(s.e)
	tr := &http.Transport{MaxIdleConnsPerHost: 200}
	s.client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	s.url = srv.URL
	s.t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
}

// tenantScope is the scope option the tests use: the X-Tenant header.
func tenantScope() echoidem.Option {
	return echoidem.WithScope(func(c echo.Context) (string, error) {
		return c.Request().Header.Get("X-Tenant"), nil
	})
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func (r *result) String() string { return fmt.Sprintf("%d %q %v", r.status, r.body, r.header) }

// send is safe from any goroutine: it returns an error instead of failing.
func (s *server) send(method, path, key, body string, hdr ...string) (*result, error) {
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
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
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &result{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// do is send for the test goroutine.
func (s *server) do(method, path, key, body string, hdr ...string) *result {
	s.t.Helper()
	r, err := s.send(method, path, key, body, hdr...)
	require.NoError(s.t, err, "%s %s", method, path)
	return r
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

// problemType returns the problem type name of a problem+json response.
func problemType(t *testing.T, r *result) string {
	t.Helper()
	assert.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "Content-Type of %v", r)
	var p core.Problem
	require.NoError(t, json.Unmarshal(r.body, &p), "problem body %q", r.body)
	assert.Equal(t, r.status, p.Status, "problem status, response status")
	return strings.TrimPrefix(p.Type, core.ProblemBaseURI)
}
