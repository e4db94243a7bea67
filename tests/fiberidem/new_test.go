package fiberidem_test

import (
	"github.com/gofiber/fiber/v2"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/fiberidem"
)

// mw builds the middleware, panicking on a construction error (tests only).
func mw(eng *core.Engine, opts ...fiberidem.Option) fiber.Handler {
	m, err := fiberidem.New(eng, opts...)
	if err != nil {
		panic(err)
	}
	return m
}
