package ginidemtest

import (
	"github.com/idemkit/idem/core/idemtest"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
)

// Request describes one request served in process by Do.
type Request struct {
	Method string // POST when empty
	Path   string
	Key    string // the Idempotency-Key header, when not empty
	Body   string
	Header map[string]string
}

// Response is a response read in full.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do serves r through h in process (httptest) and returns the response.
// It never fails the test, so goroutines may use it.
func Do(h http.Handler, r Request) *Response {
	if r.Method == "" {
		r.Method = http.MethodPost
	}
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(r.Body)
	}
	hr := httptest.NewRequest(r.Method, r.Path, body)
	if r.Key != "" {
		hr.Header.Set("Idempotency-Key", r.Key)
	}
	for k, v := range r.Header {
		hr.Header.Set(k, v)
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, hr)
	res := rr.Result()
	b, _ := io.ReadAll(res.Body)
	return &Response{Status: res.StatusCode, Header: res.Header, Body: b}
}

// SameResponse checks that replay is first byte for byte (status, body,
// allow-listed headers, Content-Length) plus Idempotent-Replayed: true, and
// that no Set-Cookie is replayed.
func SameResponse(tb testing.TB, first, replay *Response) {
	tb.Helper()
	if replay.Status != first.Status {
		tb.Errorf("replay status %d, first %d", replay.Status, first.Status)
	}
	if string(replay.Body) != string(first.Body) {
		tb.Errorf("replay body %q, first %q", replay.Body, first.Body)
	}
	for _, h := range append([]string{"Content-Length"}, idemtest.ReplayHeaders()...) {
		if a, b := first.Header.Values(h), replay.Header.Values(h); !slices.Equal(a, b) {
			tb.Errorf("replay header %s: %q, first %q", h, b, a)
		}
	}
	if v := replay.Header.Get(core.ReplayedHeader); v != "true" {
		tb.Errorf("replay %s: %q, want \"true\"", core.ReplayedHeader, v)
	}
	if v := first.Header.Get(core.ReplayedHeader); v != "" {
		tb.Errorf("first response carries %s: %q", core.ReplayedHeader, v)
	}
	if v := replay.Header.Values("Set-Cookie"); len(v) > 0 {
		tb.Errorf("replay carries Set-Cookie: %q", v)
	}
}
