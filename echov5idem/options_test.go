package echov5idem_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/echov5idem"
)

// TestSkipLetsRequestsThrough: a middleware.Skipper is accepted as is;
// skipped requests need no key and record nothing.
func TestSkipLetsRequestsThrough(t *testing.T) {
	eng, store := newEngine(t)
	var skip middleware.Skipper = func(c *echo.Context) bool { return c.Request().Header.Get("X-Internal") != "" }
	e := echo.New()
	e.Use(mw(t, eng, echov5idem.WithSkip(skip)))
	e.POST("/v1/payments", func(c *echo.Context) error { return c.NoContent(http.StatusCreated) })
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader("{}"))
	req.Header.Set("X-Internal", "1")
	w := httptest.NewRecorder()
	e.ServeHTTP(w, req)
	assert.Equal(t, http.StatusCreated, w.Code, "skipped request")
	assert.Zero(t, store.Len(), "records after a skipped request")
	w = serve(e, http.MethodPost, "/v1/payments", "", strings.NewReader("{}"))
	assert.Equal(t, http.StatusBadRequest, w.Code, "not skipped, no key")
}
