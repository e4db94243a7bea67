package ginidem_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// Headers set by middleware before idem (CORS's Vary: Origin, a request
// ID) are visible to the handler, and what it adds to them is added, as
// without idem; the captured response must not replace them.
func TestReviewOuterHeadersKept(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Writer.Header().Add("Vary", "Origin")
		c.Header("X-Request-Id", "rid")
		c.Next()
	})
	r.POST("/pay", mw(eng), func(c *gin.Context) {
		if got := c.Writer.Header().Get("X-Request-Id"); got != "rid" {
			t.Errorf("handler sees X-Request-Id %q", got)
		}
		c.Writer.Header().Add("Vary", "Accept")
		c.String(http.StatusCreated, "paid")
	})
	for i := range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		r.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated || rec.Body.String() != "paid" {
			t.Fatalf("%d: %d %q", i, rec.Code, rec.Body)
		}
		if got := strings.Join(rec.Header().Values("Vary"), ", "); got != "Origin, Accept" {
			t.Errorf("%d: Vary %q, want \"Origin, Accept\" as without idem", i, got)
		}
	}
}
