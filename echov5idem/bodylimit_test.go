package echov5idem_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/stretchr/testify/assert"
)

// TestBodyLimitAnswers413: echo's BodyLimit fails a read past the limit
// with its own 413 error; idem reads the body first (for the fingerprint)
// and answers 413 body-too-large, not 400 body-unreadable.
func TestBodyLimitAnswers413(t *testing.T) {
	eng, store := newEngine(t)
	e := echo.New()
	e.Use(middleware.BodyLimit(8), mw(t, eng))
	e.POST("/upload", func(c *echo.Context) error { return c.NoContent(http.StatusCreated) })
	// No Content-Length: BodyLimit can only fail the read.
	body := io.MultiReader(strings.NewReader(`{"data":"`), strings.NewReader(strings.Repeat("x", 64)+`"}`))
	w := serve(e, http.MethodPost, "/upload", "k", body)
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code, "over the limit; body %q", w.Body.String())
	assert.Contains(t, w.Body.String(), "body-too-large", "over the limit")
	assert.Zero(t, store.Len(), "records")
}
