package nethttpidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// A handler's trailers (declared with the Trailer header, or set under
// http.TrailerPrefix after the body) reach the client as they do without
// idem. They are not part of what is stored, but the first response must
// not lose them: the buffered response used to go out with a
// Content-Length and without the values set after the body.
func TestReviewTrailersReachClient(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Sum", "abc")
		w.Header().Set(http.TrailerPrefix+"X-Other", "def")
	})
	srv := httptest.NewServer(mw(eng)(h))
	defer srv.Close()
	post := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body) // trailers are read with the body
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != "body" {
			t.Fatalf("response: %d %q", resp.StatusCode, b)
		}
		return resp
	}
	first := post()
	if got := first.Trailer.Get("X-Sum"); got != "abc" {
		t.Errorf("declared trailer X-Sum = %q, want abc (trailers %v)", got, first.Trailer)
	}
	if got := first.Trailer.Get("X-Other"); got != "def" {
		t.Errorf("prefixed trailer X-Other = %q, want def (trailers %v)", got, first.Trailer)
	}
	if replay := post(); replay.Header.Get(core.ReplayedHeader) != "true" {
		t.Errorf("second request not replayed: %v", replay.Header)
	}
}

// A header an outer middleware set before idem (CORS's Vary: Origin) is
// visible to the handler, and a value the handler adds to it is added, as
// without idem: the buffered response must not replace Vary: Origin with
// the handler's Vary: Accept (a shared cache would then serve one origin's
// response to another).
func TestReviewOuterHeadersKept(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := w.Header().Get("X-Request-Id"); got != "rid" {
			t.Errorf("handler sees X-Request-Id %q", got)
		}
		w.Header().Add("Vary", "Accept")
		w.WriteHeader(http.StatusCreated)
	})
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Vary", "Origin")
			w.Header().Set("X-Request-Id", "rid")
			next.ServeHTTP(w, r)
		})
	}
	srv := outer(mw(eng)(h))
	for i := range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		srv.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			t.Fatalf("%d: status %d", i, rec.Code)
		}
		if got := strings.Join(rec.Header().Values("Vary"), ", "); got != "Origin, Accept" {
			t.Errorf("%d: Vary %q, want \"Origin, Accept\" as without idem", i, got)
		}
	}
}
