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

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

func newEngine(tb testing.TB, opts ...core.Option) *core.Engine {
	tb.Helper()
	return newEngineOn(tb, memstore.New(), opts...)
}

func newEngineOn(tb testing.TB, s core.Store, opts ...core.Option) *core.Engine {
	tb.Helper()
	eng, err := core.New(s, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	if err != nil {
		tb.Fatalf("core.New: %v", err)
	}
	return eng
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
	if replay.status != first.status {
		t.Errorf("replay status = %d, want %d", replay.status, first.status)
	}
	if string(replay.body) != string(first.body) {
		t.Errorf("replay body = %q, want %q", replay.body, first.body)
	}
	for _, h := range append([]string{"Content-Length"}, core.DefaultReplayHeaders()...) {
		if got, want := replay.header.Values(h), first.header.Values(h); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("replay header %s = %q, want %q", h, got, want)
		}
	}
	if got := replay.header.Get(core.ReplayedHeader); got != "true" {
		t.Errorf("replay %s = %q, want true", core.ReplayedHeader, got)
	}
	if got := first.header.Get(core.ReplayedHeader); got != "" {
		t.Errorf("first response carries %s: %q", core.ReplayedHeader, got)
	}
	if got := replay.header.Values("Set-Cookie"); len(got) != 0 {
		t.Errorf("replay carries Set-Cookie %q", got)
	}
}

// checkProblem checks that r is a problem+json response of the given
// status and type name (core.Problem*).
func checkProblem(t *testing.T, r *response, status int, name string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status = %d, want %d (%s); body %q", r.status, status, name, r.body)
		return
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	var p core.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Errorf("problem body %q: %v", r.body, err)
		return
	}
	if want := core.ProblemBaseURI + name; p.Type != want {
		t.Errorf("problem type = %q, want %q", p.Type, want)
	}
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
