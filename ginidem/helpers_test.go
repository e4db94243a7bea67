package ginidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/ginidem"
)

const payBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

func newEngine(tb testing.TB, opts ...core.Option) *core.Engine {
	tb.Helper()
	return newEngineOn(tb, memstore.New(), opts...)
}

func newEngineOn(tb testing.TB, s core.Store, opts ...core.Option) *core.Engine {
	tb.Helper()
	eng, err := core.New(s, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	require.NoError(tb, err, "core.New")
	return eng
}

// mw builds the middleware, panicking on a construction error (tests only).
func mw(eng *core.Engine, opts ...ginidem.Option) gin.HandlerFunc {
	m, err := ginidem.New(eng, opts...)
	if err != nil {
		panic(err)
	}
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

// checkProblem checks that r is a problem+json response of the given
// status and type name (core.Problem*).
func checkProblem(t *testing.T, r *response, status int, name string) {
	t.Helper()
	if !assert.Equal(t, status, r.status, "status (%s); body %q", name, r.body) {
		return
	}
	assert.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p core.Problem
	if !assert.NoError(t, json.Unmarshal(r.body, &p), "problem body %q", r.body) {
		return
	}
	assert.Equal(t, core.ProblemBaseURI+name, p.Type, "problem type")
}

var errCommitDown = errors.New("test: complete failed")

// failCompleteStore fails Complete (and Fail when failAll), as a database
// going away between claim and commit would.
type failCompleteStore struct {
	core.Store
	failAll bool
}

func (s failCompleteStore) Complete(context.Context, storekit.Fence, storekit.StoredResponse) error {
	return errCommitDown
}

func (s failCompleteStore) Fail(ctx context.Context, f storekit.Fence) error {
	if s.failAll {
		return errCommitDown
	}
	return s.Store.Fail(ctx, f)
}
