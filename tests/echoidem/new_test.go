package echoidem_test

import (
	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echoidem"
)

// mw builds the middleware, panicking on a construction error (tests only).
func mw(eng *core.Engine, opts ...echoidem.Option) echo.MiddlewareFunc {
	m, err := echoidem.New(eng, opts...)
	if err != nil {
		panic(err)
	}
	return m
}
