package echov5idem_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOuterGzip: with echo's Gzip middleware outside idem (e.Use(Gzip)
// first, as echo apps mount it), idem captures what the handler wrote, not
// gzip's output (gzip only finishes its stream after the handler chain
// returns): the first response and its replays decode to the same body,
// compressed for a client that accepts gzip and plain for one that does
// not.
func TestOuterGzip(t *testing.T) {
	eng, _ := newEngine(t)
	e := echo.New()
	e.Use(middleware.Gzip(), mw(t, eng))
	payload := strings.Repeat(`{"line":"the same text, compressible"}`, 100)
	runs := 0
	e.POST("/v1/report", func(c *echo.Context) error {
		runs++
		return c.Blob(http.StatusCreated, "application/json", []byte(payload))
	})
	send := func(gz bool) (int, string, http.Header) {
		req := httptest.NewRequest(http.MethodPost, "/v1/report", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k-gzip")
		if gz {
			req.Header.Set("Accept-Encoding", "gzip")
		}
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		body := w.Body.Bytes()
		if w.Header().Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			require.NoError(t, err, "gzip response")
			body, err = io.ReadAll(zr)
			require.NoError(t, err, "gzip body")
		}
		return w.Code, string(body), w.Header()
	}
	for i, gz := range []bool{true, true, false} {
		status, body, hdr := send(gz)
		assert.Equal(t, http.StatusCreated, status, "request %d (gzip %v)", i, gz)
		assert.Equal(t, payload, body, "request %d (gzip %v): decoded body", i, gz)
		assert.Equal(t, gz, hdr.Get("Content-Encoding") == "gzip", "request %d (gzip %v): Content-Encoding %q", i, gz, hdr.Get("Content-Encoding"))
	}
	assert.Equal(t, 1, runs, "handler runs")
}
