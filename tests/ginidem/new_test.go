package ginidem_test

import (
	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/ginidem"
)

// mw builds the middleware, panicking on a construction error (tests only).
func mw(eng *core.Engine, opts ...ginidem.Option) gin.HandlerFunc {
	m, err := ginidem.New(eng, opts...)
	if err != nil {
		panic(err)
	}
	return m
}
