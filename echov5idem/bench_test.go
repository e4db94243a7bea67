package echov5idem_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core"
)

const benchBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

func benchHandler(c *echo.Context) error {
	return c.JSON(http.StatusCreated, map[string]any{"id": "pay_1", "amount": 1000, "currency": "JPY", "to": "alice"})
}

// BenchmarkMiddleware compares a bare Echo handler with the same handler
// behind idem on memstore: a first execution (fresh key every time) and a
// replay (one key, stored once). Requests go through e.ServeHTTP with an
// httptest.ResponseRecorder, no network.
func BenchmarkMiddleware(b *testing.B) {
	newEcho := func(mw ...echo.MiddlewareFunc) *echo.Echo {
		e := echo.New()
		e.POST("/v1/payments", benchHandler, mw...)
		return e
	}
	serve := func(b *testing.B, e *echo.Echo, key string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(benchBody))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	benchEngine := func(b *testing.B) *core.Engine {
		eng, _ := newEngine(b)
		return eng
	}

	b.Run("bare", func(b *testing.B) {
		e := newEcho()
		b.ReportAllocs()
		for b.Loop() {
			serve(b, e, "")
		}
	})
	b.Run("idem-first", func(b *testing.B) {
		e := newEcho(mw(b, benchEngine(b)))
		keys := make([]string, 0, 1<<16)
		for i := range cap(keys) {
			keys = append(keys, "key-"+strconv.Itoa(i))
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if i == len(keys) { // keep keys fresh without timing their creation
				b.StopTimer()
				e = newEcho(mw(b, benchEngine(b)))
				i = 0
				b.StartTimer()
			}
			serve(b, e, keys[i])
			i++
		}
	})
	b.Run("idem-replay", func(b *testing.B) {
		e := newEcho(mw(b, benchEngine(b)))
		serve(b, e, "the-key")
		b.ReportAllocs()
		for b.Loop() {
			serve(b, e, "the-key")
		}
	})
}
