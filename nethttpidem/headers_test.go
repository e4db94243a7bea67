package nethttpidem_test

// Headers and trailers: what outer middleware set, what the handler
// added, deleted or sent after the body, reach the client as without idem.

import (
	"github.com/idemkit/idem/core/problem"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestHeaderDeletionsHonoured: a header outer middleware set and the
// handler deleted does not reach the client (as without idem); one it kept
// does, and a problem written instead of the handler's response keeps the
// outer headers but none of the handler's.
func TestHeaderDeletionsHonoured(t *testing.T) {
	eng := newEngine(t, memstore.New())
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Outer-Kept", "1")
			w.Header().Set("X-Outer-Deleted", "1")
			next.ServeHTTP(w, r)
		})
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Del("X-Outer-Deleted")
		w.Header().Set("X-Handler", "1")
		if r.Header.Get("X-Panic") != "" {
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := outer(mw(eng)(h))
	do := func(key string, panicking bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", key)
		if panicking {
			req.Header.Set("X-Panic", "1")
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		return rec
	}
	r := do("del-1", false)
	assert.Equal(t, http.StatusCreated, r.Code, "handler response")
	assert.Empty(t, r.Header().Get("X-Outer-Deleted"), "handler response: the header the handler deleted")
	assert.Equal(t, "1", r.Header().Get("X-Outer-Kept"), "handler response: the outer header kept")
	assert.Equal(t, "1", r.Header().Get("X-Handler"), "handler response: the handler's header")
	p := do("del-2", true)
	assert.Equal(t, http.StatusInternalServerError, p.Code, "problem instead: %s", p.Body)
	assert.Equal(t, "1", p.Header().Get("X-Outer-Kept"), "problem: the outer headers")
	assert.Equal(t, "1", p.Header().Get("X-Outer-Deleted"), "problem: the outer headers, as set before the handler")
	assert.Empty(t, p.Header().Get("X-Handler"), "problem: none of the handler's headers")
	assert.Contains(t, p.Body.String(), problem.HandlerPanic)
}

// TestHandlerTrailersReachClient: a handler's trailers (declared with the
// Trailer header, or set under http.TrailerPrefix after the body) reach the
// client as they do without idem. They are not part of what is stored, but
// the first response must not lose them: the buffered response used to go
// out with a Content-Length and without the values set after the body.
func TestHandlerTrailersReachClient(t *testing.T) {
	eng := newEngine(t, memstore.New())
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
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body) // trailers are read with the body
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode, "body %q", b)
		require.Equal(t, "body", string(b))
		return resp
	}
	first := post()
	assert.Equal(t, "abc", first.Trailer.Get("X-Sum"), "declared trailer X-Sum (trailers %v)", first.Trailer)
	assert.Equal(t, "def", first.Trailer.Get("X-Other"), "prefixed trailer X-Other (trailers %v)", first.Trailer)
	replay := post()
	assert.Equal(t, "true", replay.Header.Get(core.ReplayedHeader), "second request not replayed: %v", replay.Header)
}

// TestOuterMiddlewareHeadersKeptAndAddedTo: a header an outer middleware
// set before idem (CORS's Vary: Origin) is visible to the handler, and a
// value the handler adds to it is added, as without idem: the buffered
// response must not replace Vary: Origin with the handler's Vary: Accept
// (a shared cache would then serve one origin's response to another).
// The replay answers the same.
func TestOuterMiddlewareHeadersKeptAndAddedTo(t *testing.T) {
	eng := newEngine(t, memstore.New())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "rid", w.Header().Get("X-Request-Id"), "the handler sees the outer X-Request-Id")
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
		require.Equal(t, http.StatusCreated, rec.Code, "request %d", i)
		assert.Equal(t, "Origin, Accept", strings.Join(rec.Header().Values("Vary"), ", "), "request %d: Vary as without idem", i)
	}
}
