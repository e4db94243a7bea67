package echoidemtest

import (
	"fmt"
	"github.com/idemkit/idem/core/idemtest"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// Server is one test's Echo app behind a real listener, with its own
// client: NewServer builds it, the test adds routes to E (with the idem
// middleware built on Eng), then Start serves it.
type Server struct {
	E      *echo.Echo
	Eng    *core.Engine // on Store, with one key space for every caller
	Store  core.Store
	URL    string       // the base URL, once started
	Client *http.Client // once started

	tb testing.TB
}

// NewServer builds an engine on store (memstore when nil) with opts and an
// Echo app without banner; the caller adds routes, then calls Start.
func NewServer(tb testing.TB, store core.Store, opts ...core.Option) *Server {
	tb.Helper()
	if store == nil {
		store = memstore.New()
	}
	eng, err := core.New(store, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	if err != nil {
		tb.Fatalf("core.New: %v", err)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	return &Server{E: e, Eng: eng, Store: store, tb: tb}
}

// Start serves the app on a real listener, with a client whose idle
// connections are closed, and the listener with them, when the test ends.
func (s *Server) Start() {
	srv := httptest.NewServer(s.E)
	tr := &http.Transport{MaxIdleConnsPerHost: 200}
	s.Client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	s.URL = srv.URL
	s.tb.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
}

// Result is a response read in full.
type Result struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r *Result) String() string { return fmt.Sprintf("%d %q %v", r.Status, r.Body, r.Header) }

// Replayed reports whether r carries Idempotent-Replayed: true.
func (r *Result) Replayed() bool { return r.Header.Get(core.ReplayedHeader) == "true" }

// Send sends one request to path with the Idempotency-Key key (none when
// empty), body as JSON (none when empty) and hdr (name, value pairs), and
// reads the response in full. It never fails the test, so goroutines may
// use it.
func (s *Server) Send(method, path, key, body string, hdr ...string) (*Result, error) {
	req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
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
	resp, err := s.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &Result{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// Do is Send that fails the test on a transport error: call it from the
// test's goroutine only.
func (s *Server) Do(method, path, key, body string, hdr ...string) *Result {
	s.tb.Helper()
	r, err := s.Send(method, path, key, body, hdr...)
	if err != nil {
		s.tb.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// SameResponse checks a replay against the first response: status, body
// byte for byte, every allow-listed header and Content-Length, the replay
// marker, and no Set-Cookie.
func SameResponse(tb testing.TB, first, replay *Result) {
	tb.Helper()
	if first.Replayed() {
		tb.Errorf("first response is marked replayed: %v", first)
	}
	if !replay.Replayed() {
		tb.Errorf("replay is not marked %s: true: %v", core.ReplayedHeader, replay)
	}
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
	if v := replay.Header.Values("Set-Cookie"); len(v) > 0 {
		tb.Errorf("replay carries Set-Cookie: %q", v)
	}
}
