package nethttpidem_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
	if r.Code != http.StatusCreated || r.Header().Get("X-Outer-Deleted") != "" || r.Header().Get("X-Outer-Kept") != "1" || r.Header().Get("X-Handler") != "1" {
		t.Errorf("handler response: %d %v", r.Code, r.Header())
	}
	p := do("del-2", true)
	if p.Code != http.StatusInternalServerError || p.Header().Get("X-Outer-Kept") != "1" || p.Header().Get("X-Outer-Deleted") != "1" ||
		p.Header().Get("X-Handler") != "" || !strings.Contains(p.Body.String(), core.ProblemHandlerPanic) {
		t.Errorf("problem instead: %d %v %s", p.Code, p.Header(), p.Body)
	}
}
