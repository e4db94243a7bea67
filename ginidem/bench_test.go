package ginidem_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// benchRouter serves POST /v1/payments, behind idem on memstore when withIdem.
func benchRouter(b *testing.B, withIdem bool) *gin.Engine {
	b.Helper()
	r := gin.New()
	h := func(c *gin.Context) { c.JSON(http.StatusCreated, gin.H{"id": "pay_1", "amount": 1000}) }
	if withIdem {
		r.POST("/v1/payments", mw(newEngine(b)), h)
	} else {
		r.POST("/v1/payments", h)
	}
	return r
}

func benchServe(b *testing.B, r http.Handler, key string) {
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(payBody))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		b.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
}

// BenchmarkBare is the gin handler alone.
func BenchmarkBare(b *testing.B) {
	r := benchRouter(b, false)
	b.ReportAllocs()
	for b.Loop() {
		benchServe(b, r, "")
	}
}

// BenchmarkFirstExecution: every request has a fresh key (claim, run,
// commit) on memstore.
func BenchmarkFirstExecution(b *testing.B) {
	r := benchRouter(b, true)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		benchServe(b, r, "k-"+strconv.Itoa(i))
	}
}

// BenchmarkReplay: every request replays one stored key on memstore.
func BenchmarkReplay(b *testing.B) {
	r := benchRouter(b, true)
	benchServe(b, r, "replayed")
	b.ReportAllocs()
	for b.Loop() {
		benchServe(b, r, "replayed")
	}
}
