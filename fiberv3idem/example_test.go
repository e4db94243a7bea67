package fiberv3idem_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/gofiber/fiber/v3"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberv3idem"
)

// userID stands for the app's authentication: the scope is the user an
// auth middleware stored in the request's locals, never the client's key.
func userID(c fiber.Ctx) (string, error) {
	if id, ok := c.Locals("user_id").(string); ok && id != "" {
		return id, nil
	}
	return "", errors.New("unauthenticated") // answered 401
}

// auth stands for the app's authentication middleware.
func auth(c fiber.Ctx) error {
	c.Locals("user_id", c.Get("X-User-ID"))
	return c.Next()
}

// send runs one POST through app (app.Listen serves the same in production).
func send(app *fiber.App, path string) {
	req := httptest.NewRequest(fiber.MethodPost, path, strings.NewReader(`{"amount":1000}`))
	req.Header.Set("X-User-ID", "alice")
	req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
	resp, err := app.Test(req, fiber.TestConfig{Timeout: 0})
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
}

// A complete service: engine, store, scope, and idem mounted on the route.
func Example() {
	eng, err := core.New(memstore.New()) // pgstore.New(pool), mysqlstore.New(db) or sqlitestore in production
	if err != nil {
		log.Fatal(err)
	}
	// Records are keyed by (user, key): without a scope New fails.
	idem, err := fiberv3idem.New(eng, fiberv3idem.WithScope(userID))
	if err != nil {
		log.Fatal(err)
	}
	app := fiber.New(fiber.Config{
		StreamRequestBody: true,            // idem reads the body within core.WithMaxRequestBytes
		ReadTimeout:       5 * time.Second, // cuts slow clients; lets a graceful shutdown finish
	})
	app.Use(auth)
	app.Post("/v1/payments", idem, func(c fiber.Ctx) error {
		// c.Context() carries the lease: core.RelayKey, pgstore.Tx.
		_ = core.RelayKey(c.Context(), "provider-charge")
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"id": "pay_1"})
	})

	// A request and its retry: the handler runs once, the retry is a replay.
	send(app, "/v1/payments")
	send(app, "/v1/payments")
	// Output:
	// 201  {"id":"pay_1"}
	// 201 true {"id":"pay_1"}
}

// Mounted with app.Use, idem runs before fiber has reached the route, so by
// default the fingerprint holds the request path ("/v1/orders/42"). Name
// the template instead, so that records agree with the rest of a fleet.
func ExampleWithRoute() {
	eng, err := core.New(memstore.New())
	if err != nil {
		log.Fatal(err)
	}
	idem, err := fiberv3idem.New(eng,
		fiberv3idem.WithScope(userID),
		fiberv3idem.WithRoute(func(c fiber.Ctx) string {
			if strings.HasPrefix(c.Path(), "/v1/orders/") {
				return "/v1/orders/:id"
			}
			return c.Path()
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	app := fiber.New()
	app.Use(auth)
	app.Use(idem)
	app.Post("/v1/orders/:id", func(c fiber.Ctx) error {
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"order": c.Params("id")})
	})

	send(app, "/v1/orders/42")
	send(app, "/v1/orders/42")
	// Output:
	// 201  {"order":"42"}
	// 201 true {"order":"42"}
}
