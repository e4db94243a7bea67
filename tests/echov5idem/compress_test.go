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
			if err != nil {
				t.Fatalf("gzip response: %v", err)
			}
			if body, err = io.ReadAll(zr); err != nil {
				t.Fatalf("gzip body: %v", err)
			}
		}
		return w.Code, string(body), w.Header()
	}
	for i, gz := range []bool{true, true, false} {
		status, body, hdr := send(gz)
		if status != http.StatusCreated || body != payload {
			t.Errorf("request %d (gzip %v): %d, body of %d bytes (want %d), Content-Encoding %q",
				i, gz, status, len(body), len(payload), hdr.Get("Content-Encoding"))
		}
		if enc := hdr.Get("Content-Encoding"); (enc == "gzip") != gz {
			t.Errorf("request %d (gzip %v): Content-Encoding %q", i, gz, enc)
		}
	}
	if runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}
}
