package echoidem_test

import (
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemkit/idem/core/memstore"
)

// TestStreamedCommitFailureCutsResponse: a flushed 201 whose outcome could
// not be recorded reaches the client broken, never complete, through
// echo's Recover too (which passes http.ErrAbortHandler on).
func TestStreamedCommitFailureCutsResponse(t *testing.T) {
	s := newServer(t, failStore{Store: memstore.New(), finish: true})
	s.e.Use(middleware.Recover())
	s.e.POST("/pay", func(c echo.Context) error {
		c.Response().WriteHeader(http.StatusCreated)
		_, _ = c.Response().Write([]byte(`{"id":"pay_1",`))
		c.Response().Flush()
		_, _ = c.Response().Write([]byte(`"status":"charged"}`))
		return nil
	}, mw(s.eng))
	s.start()
	if r, err := s.send("POST", "/pay", "k", `{"amount":1}`); err == nil {
		t.Fatalf("client got a complete %v for an outcome that was not recorded; want a broken response", r)
	}
}
