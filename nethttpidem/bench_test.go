package nethttpidem_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

const benchBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

// benchHandler answers like the payments example: a 201 with a small JSON
// body and a Location header.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/payments/pay_1")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": "pay_1", "amount": 1000, "currency": "JPY", "to": "alice"})
})

// benchServer serves POST /v1/payments on an http.ServeMux, behind the
// middleware when eng is not nil. Requests go through ServeHTTP with an
// httptest.ResponseRecorder: no network, only the mux and the middleware.
type benchServer struct {
	h    http.Handler
	body bytes.Reader
	req  *http.Request
}

func newBenchServer(eng *core.Engine) *benchServer {
	mux := http.NewServeMux()
	if eng != nil {
		mux.Handle("POST /v1/payments", mw(eng)(benchHandler))
	} else {
		mux.Handle("POST /v1/payments", benchHandler)
	}
	s := &benchServer{h: mux}
	s.req = httptest.NewRequest(http.MethodPost, "/v1/payments", &s.body)
	s.req.Header.Set("Content-Type", "application/json")
	return s
}

func (s *benchServer) serve(b *testing.B, key string) {
	s.body.Reset([]byte(benchBody))
	r := s.req.Clone(s.req.Context()) // the middleware replaces Body
	r.Body = readCloser{&s.body}
	if key != "" {
		r.Header["Idempotency-Key"] = []string{key}
	}
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, r)
	if rec.Code != http.StatusCreated {
		b.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// cpuLoop runs op b.Loop() times with allocations reported and adds the
// process CPU time per operation (cpu-ns/op), steadier than wall time on a
// shared machine.
func cpuLoop(b *testing.B, op func()) {
	b.ReportAllocs()
	start := processCPU()
	n := 0
	for b.Loop() {
		op()
		n++
	}
	if end := processCPU(); start >= 0 && end >= 0 && n > 0 {
		b.ReportMetric(float64(end-start)/float64(n), "cpu-ns/op")
	}
}

func benchEngine(b *testing.B) *core.Engine {
	b.Helper()
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		b.Fatal(err)
	}
	return eng
}

// BenchmarkMiddleware compares, in one run, the bare handler with the same
// handler behind nethttpidem on memstore: a first execution (fresh key each
// time; the server and its store are rebuilt outside the timer every 1<<16
// keys) and a replay (one stored key). The difference is the in-process
// overhead of idem on net/http.
func BenchmarkMiddleware(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		s := newBenchServer(nil)
		cpuLoop(b, func() { s.serve(b, "") })
	})
	b.Run("idem-first", func(b *testing.B) {
		keys := make([]string, 1<<16)
		for i := range keys {
			keys[i] = strconv.FormatInt(int64(i), 16) + "-0000-4000-8000-000000000000"
		}
		s := newBenchServer(benchEngine(b))
		i := 0
		cpuLoop(b, func() {
			if i == len(keys) {
				b.StopTimer()
				s, i = newBenchServer(benchEngine(b)), 0
				b.StartTimer()
			}
			s.serve(b, keys[i])
			i++
		})
	})
	b.Run("idem-replay", func(b *testing.B) {
		s := newBenchServer(benchEngine(b))
		s.serve(b, "the-key")
		cpuLoop(b, func() { s.serve(b, "the-key") })
	})
}
