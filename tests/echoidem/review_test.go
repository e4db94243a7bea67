package echoidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// Echo's own BodyLimit middleware, for a body without Content-Length
// (chunked, or HTTP/2), fails the body read with a 413 *echo.HTTPError
// instead of http.MaxBytesReader's error. The engine reads the body before
// the handler, and must answer that overflow as what it is, 413
// body-too-large, not as a broken body (400 body-unreadable, "the client
// went away"), and never run the handler.
func TestReviewEchoBodyLimitIs413(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	e := echo.New()
	e.Use(middleware.BodyLimit("16B"))
	e.POST("/pay", func(c echo.Context) error {
		runs.Add(1)
		return c.String(http.StatusCreated, "paid")
	}, mw(eng))

	for _, tc := range []struct {
		name          string
		contentLength int64
	}{{"chunked", -1}, {"content-length", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/pay", io.NopCloser(strings.NewReader(strings.Repeat("x", 100))))
			req.ContentLength = tc.contentLength
			req.Header.Set("Idempotency-Key", "k-"+tc.name)
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, req)
			if rec.Code != http.StatusRequestEntityTooLarge {
				t.Errorf("over echo's body limit: %d %s", rec.Code, rec.Body)
			}
		})
	}
	if runs.Load() != 0 {
		t.Errorf("handler ran %d times", runs.Load())
	}
}
