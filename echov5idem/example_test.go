package echov5idem_test

import (
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echov5idem"
)

// auth stands for the app's authentication middleware: it puts the user
// in the context, where the scope function finds it.
func auth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		c.Set("user", c.Request().Header.Get("X-User-ID"))
		return next(c)
	}
}

func createPayment(c *echo.Context) error {
	return c.JSON(http.StatusCreated, map[string]string{"id": "pay_1"})
}

func ExampleNew() {
	eng, err := core.New(memstore.New()) // pgstore.New(pool) in production
	if err != nil {
		log.Fatal(err)
	}
	e := echo.New()
	e.Use(auth)
	// Records are keyed by (user, key): without a scope New fails.
	idem, err := echov5idem.New(eng, echov5idem.WithScope(func(c *echo.Context) (string, error) {
		if user, _ := c.Get("user").(string); user != "" {
			return user, nil
		}
		return "", errors.New("unauthenticated") // answered 401
	}))
	if err != nil {
		log.Fatal(err)
	}
	e.Use(idem) // requests no route serves pass through to echo's 404/405
	e.POST("/v1/payments", createPayment)

	// A request and its retry: the handler runs once, the retry is a replay.
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("X-User-ID", "alice")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), strings.TrimSpace(rec.Body.String()))
	}
	// Output:
	// 201  {"id":"pay_1"}
	// 201 true {"id":"pay_1"}
}
