package ginidem

import (
	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core/adapterkit"
)

// Option configures New. A nil Option is ignored.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// ErrorHandler writes the response when idem cannot do its job: the store is
// unreachable (nothing ran) or the handler's outcome could not be recorded
// (its response is discarded). err describes the failure; fallback is the
// problem+json response idem would write (503, or 409 when the lease was lost
// to a retry). The middleware calls c.Abort itself. A handler that writes
// nothing and leaves gin's default status 200 gets fallback written for it:
// a request that did not complete must never look like a success.
type ErrorHandler func(c *gin.Context, err error, fallback *adapterkit.Response)

type config struct {
	scope   func(*gin.Context) (string, error)
	skip    func(*gin.Context) bool
	onError ErrorHandler
}

// WithScope sets the function returning the request's tenant, typically a
// value an authentication middleware stored earlier in the chain:
//
//	ginidem.WithScope(func(c *gin.Context) (string, error) {
//		user := c.GetString("user")
//		if user == "" {
//			return "", errors.New("unauthenticated")
//		}
//		return user, nil
//	})
//
// It is called only for requests idem protects. An error answers a 401
// problem (logged, and in the observer's event) and the handler does not
// run. Keys are unique per scope. Required: New fails without it (a nil f
// counts as without), unless the engine has core.WithScope or
// core.WithSharedKeySpace.
func WithScope(f func(*gin.Context) (string, error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.scope = f
		}
	})
}

// WithSkip sets a predicate for requests idem must not touch at all: they go
// down the chain as if the middleware were absent (no key required, nothing
// recorded). Default (or nil): no request is skipped; safe methods and
// methods outside core.WithMethods bypass idem anyway.
func WithSkip(f func(*gin.Context) bool) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.skip = f
		}
	})
}

// WithErrorHandler sets how store failures are answered (see ErrorHandler).
// Default (or nil): write fallback, the problem+json response, with gin's
// writer.
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(c *config) {
		if h != nil {
			c.onError = h
		}
	})
}
