package echoidem_test

import (
	"github.com/idemkit/idem/core/problem"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestRequestBodyTooLarge: a body over core.WithMaxRequestBytes is answered
// 413 body-too-large and the handler does not run.
func TestRequestBodyTooLarge(t *testing.T) {
	s := newServer(t, nil, core.WithMaxRequestBytes(8))
	var runs atomic.Int32
	s.E.POST("/x", func(c echo.Context) error { runs.Add(1); return c.NoContent(204) }, mw(s.Eng))
	s.Start()
	r := s.Do("POST", "/x", "k", `{"far":"too large"}`)
	if assert.Equal(t, http.StatusRequestEntityTooLarge, r.Status, "got %v", r) {
		assert.Equal(t, problem.BodyTooLarge, problemType(t, r))
	}
	assert.Zero(t, runs.Load(), "handler runs")
}

// TestBodyLimitAnswers413: echo's own BodyLimit middleware, for a body
// without Content-Length (chunked, or HTTP/2), fails the body read with a
// 413 *echo.HTTPError instead of http.MaxBytesReader's error. The engine
// reads the body before the handler, and must answer that overflow as what
// it is, 413 body-too-large, not as a broken body (400 body-unreadable, "the
// client went away"), and never run the handler.
func TestBodyLimitAnswers413(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	require.NoError(t, err)
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
			assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, "over echo's body limit: %s", rec.Body)
		})
	}
	assert.Zero(t, runs.Load(), "handler runs")
}
