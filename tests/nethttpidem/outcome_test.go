package nethttpidem_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestStreamedCommitFailureCutsResponse: a response that went out before
// Commit (flushed, or over the response limit) whose outcome could then
// not be recorded must not reach the client as a complete success: the
// record is not completed (a retry runs the handler again; in
// transactional mode its writes rolled back), so the client must see a
// broken response and retry, never a clean 201.
func TestStreamedCommitFailureCutsResponse(t *testing.T) {
	handlers := map[string]http.HandlerFunc{
		"flushed": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"pay_1",`)
			http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, `"status":"charged"}`)
		},
		"over_limit": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"pay_1","memo":"`+strings.Repeat("x", 256)+`"}`)
		},
	}
	errs := map[string]error{
		"store_error": errors.New("db down at commit"),
		"lease_lost":  fmt.Errorf("fenced: %w", core.ErrLeaseLost),
	}
	for hname, h := range handlers {
		for ename, cerr := range errs {
			t.Run(hname+"/"+ename, func(t *testing.T) {
				eng := newEngine(t, &faultStore{Store: memstore.New(), completeErr: cerr}, core.WithMaxResponseBytes(64))
				srv := serve(t, eng, "POST /pay", h)
				r, err := post(newClient(t), srv.URL+"/pay", "k", payBody)
				if err == nil {
					t.Fatalf("client got a complete %d %q for an outcome that was not recorded; want a broken response", r.status, r.body)
				}
			})
		}
	}
}
