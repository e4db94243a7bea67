package nethttpidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
)

func postKey(t *testing.T, url, key, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestChiRegexpRouteSharesRecord: chi's "{id:[0-9]+}" (through WithRoute,
// as chi users mount it) is the same route as ServeMux's "{id}": a key
// first served by one replays through the other.
func TestChiRegexpRouteSharesRecord(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "run")
		runs.Add(1)
	})
	scope := nethttpidem.WithScope(func(*http.Request) (string, error) { return "u", nil })
	chiStyle, err := nethttpidem.New(eng, scope, nethttpidem.WithRoute(func(*http.Request) string { return "/v1/orders/{id:[0-9]+}/confirm" }))
	if err != nil {
		t.Fatal(err)
	}
	muxStyle, err := nethttpidem.New(eng, scope)
	if err != nil {
		t.Fatal(err)
	}
	chiSrv := httptest.NewServer(chiStyle(h))
	defer chiSrv.Close()
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}/confirm", muxStyle(h))
	muxSrv := httptest.NewServer(mux)
	defer muxSrv.Close()

	if s, b, _ := postKey(t, chiSrv.URL+"/v1/orders/7/confirm", "k-chi", "{}"); s != http.StatusCreated || b != "run" {
		t.Fatalf("first via chi-style route: %d %q", s, b)
	}
	if s, b, hdr := postKey(t, muxSrv.URL+"/v1/orders/7/confirm", "k-chi", "{}"); s != http.StatusCreated || hdr.Get(core.ReplayedHeader) != "true" {
		t.Errorf("retry via ServeMux: %d %q replayed=%q, want the replay", s, b, hdr.Get(core.ReplayedHeader))
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestWrappedMuxLeavesUnknownPathsAlone: the middleware wrapped around a
// whole *http.ServeMux finds the pattern itself; a POST no pattern matches
// gets the mux's own 404 (405 for a known path with another method), with
// or without a key, and nothing is recorded. A matched route still works
// and records its ServeMux pattern.
func TestWrappedMuxLeavesUnknownPathsAlone(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(*http.Request) (string, error) { return "u", nil }))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/orders/{id}", func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("GET /v1/list", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("POST /v1/dir/", func(w http.ResponseWriter, _ *http.Request) { runs.Add(1) })
	srv := httptest.NewServer(mw(mux))
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	for _, key := range []string{"", "k-unknown"} {
		if s, b, _ := postKey(t, srv.URL+"/nope", key, "{}"); s != http.StatusNotFound {
			t.Errorf("POST /nope key=%q: %d %q, want the mux's 404", key, s, b)
		}
		if s, b, _ := postKey(t, srv.URL+"/v1/list", key, "{}"); s != http.StatusMethodNotAllowed {
			t.Errorf("POST /v1/list key=%q: %d %q, want the mux's 405", key, s, b)
		}
		// The mux's own redirect (/v1/dir to /v1/dir/) is not a route's answer.
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/dir", strings.NewReader("{}"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTemporaryRedirect && resp.StatusCode != http.StatusMovedPermanently {
			t.Errorf("POST /v1/dir key=%q: %d, want the mux's redirect", key, resp.StatusCode)
		}
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d records after requests to unknown routes, want 0", n)
	}
	if s, _, _ := postKey(t, srv.URL+"/v1/orders/1", "k-known", "{}"); s != http.StatusCreated {
		t.Fatalf("known route: %d", s)
	}
	rec, err := store.Get(t.Context(), "u", "k-known")
	if err != nil || rec.Route != "/v1/orders/{id}" {
		t.Errorf("known route recorded as %q (%v), want the pattern /v1/orders/{id}", rec.Route, err)
	}
	if s, _, hdr := postKey(t, srv.URL+"/v1/orders/1", "k-known", "{}"); s != http.StatusCreated || hdr.Get(core.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Errorf("retry on the known route: %d replayed=%q runs=%d", s, hdr.Get(core.ReplayedHeader), runs.Load())
	}
}
