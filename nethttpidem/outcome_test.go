package nethttpidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
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

// TestEarlyHintsHeadersStayOutOfProblem: the headers an informational
// response (103 Early Hints) carried are the handler's: a problem written
// instead of its final response (the outcome could not be recorded) does
// not carry them, as it carries none of the handler's headers.
func TestEarlyHintsHeadersStayOutOfProblem(t *testing.T) {
	eng := newEngine(t, &faultStore{Store: memstore.New(), completeErr: errors.New("db down at commit")})
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.Header().Set("Set-Cookie", "session=handler")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Location", "/payments/1")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"pay_1"}`)
	}))
	var hint textproto.MIMEHeader
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		if code == http.StatusEarlyHints {
			hint = h
		}
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
		http.MethodPost, srv.URL+"/pay", strings.NewReader(payBody))
	req.Header.Set("Idempotency-Key", "k")
	res, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d; want the 503 problem", res.StatusCode)
	}
	if hint.Get("Link") == "" {
		t.Errorf("the 103 went out without the handler's Link: %v", hint)
	}
	for _, h := range []string{"Link", "Set-Cookie", "Location"} {
		if v := res.Header.Get(h); v != "" {
			t.Errorf("the problem carries the handler's %s: %q", h, v)
		}
	}
}
