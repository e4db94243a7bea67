package ginidem_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/ginidem"
)

func Example() {
	eng, err := core.New(memstore.New()) // pgstore in production
	if err != nil {
		panic(err)
	}
	// Records are keyed by (user, key): without a scope New fails.
	idem, err := ginidem.New(eng, ginidem.WithScope(func(c *gin.Context) (string, error) {
		if user := c.GetHeader("X-User-ID"); user != "" { // usually a value set by your auth middleware
			return user, nil
		}
		return "", errors.New("unauthenticated") // answered 401
	}))
	if err != nil {
		panic(err)
	}
	r := gin.New()
	r.POST("/v1/payments", idem, func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"id": "pay_1"})
	})

	// A client retries the same request: the handler runs once.
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("X-User-ID", "alice")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Body.String(), "replayed:", rec.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 201 {"id":"pay_1"} replayed: false
	// 201 {"id":"pay_1"} replayed: true
}
