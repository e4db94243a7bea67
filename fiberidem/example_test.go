package fiberidem_test

import (
	"errors"

	"github.com/gofiber/fiber/v2"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberidem"
)

func Example() {
	eng, _ := core.New(memstore.New()) // pgstore.New(pool) in production
	userID := func(c *fiber.Ctx) (string, error) {
		if id, ok := c.Locals("user_id").(string); ok { // set by your auth middleware
			return id, nil
		}
		return "", errors.New("unauthenticated") // answered 401
	}
	// Records are keyed by (user, key): without a scope New fails.
	idem, err := fiberidem.New(eng, fiberidem.WithScope(userID))
	if err != nil {
		panic(err)
	}
	app := fiber.New()
	app.Post("/v1/payments", idem, func(c *fiber.Ctx) error {
		// c.UserContext() carries the lease: core.RelayKey, pgstore.Tx.
		chargeKey := core.RelayKey(c.UserContext(), "provider-charge")
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"charge_key": chargeKey})
	})
	_ = app.Listen(":8080")
}
