package nethttpidem_test

import (
	"net/http"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/nethttpidem"
)

// mw builds the middleware, panicking on a construction error (tests only).
func mw(eng *core.Engine, opts ...nethttpidem.Option) func(http.Handler) http.Handler {
	m, err := nethttpidem.New(eng, opts...)
	if err != nil {
		panic(err)
	}
	return m
}
