package fiberv3idem

import (
	"github.com/gofiber/fiber/v3"

	"github.com/idemkit/idem/core/adapterkit"
)

// Option configures New. Options follow the OpenTelemetry-contrib style: a
// nil Option is ignored, and so is an option given a nil function (the
// default stays in place).
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// ErrorHandler answers a request when idem cannot do its job: the store is
// unreachable (the handler did not run) or the outcome could not be
// recorded (the handler's response is discarded). fallback is the problem
// response idem would write (503, or 409 when the lease was lost). It may
// write a response through c and return nil, or return an error for the
// app's error handler to render, as from any fiber handler.
type ErrorHandler func(c fiber.Ctx, err error, fallback *adapterkit.Response) error

type config struct {
	scope   func(fiber.Ctx) (string, error)
	skip    func(fiber.Ctx) bool
	route   func(fiber.Ctx) string
	onError ErrorHandler
}

// WithScope sets the function returning the request's tenant, typically a
// value an auth middleware stored earlier in the chain:
//
//	fiberv3idem.WithScope(func(c fiber.Ctx) (string, error) {
//		id, ok := c.Locals("user_id").(string)
//		if !ok {
//			return "", errors.New("no user")
//		}
//		return id, nil
//	})
//
// It is called only for requests idem protects (after the method and key
// checks). An error answers 401 and the handler does not run; the error is
// logged and in the observer's event. The returned string is copied, so
// returning c.Get(...) (which aliases fasthttp's buffers) is safe.
// Required: New fails without it (a nil f counts as without), unless the
// engine has core.WithScope or core.WithSharedKeySpace.
func WithScope(f func(c fiber.Ctx) (string, error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.scope = f
		}
	})
}

// WithSkip sets a predicate for requests idem must not touch at all: when it
// returns true the next handler runs as if idem were absent. It is the
// equivalent of the Next field of fiber's own middleware configs.
// Default: none skipped.
func WithSkip(f func(c fiber.Ctx) bool) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.skip = f
		}
	})
}

// WithRoute sets how the route is found; it is part of the fingerprint, so
// one key reused on two routes is refused (422) instead of replaying the
// other route's response. The returned string is copied.
//
// Default: c.Route().Path, the template the handler was registered with
// ("/v1/orders/:id"), when idem is mounted on the route itself
// (app.Post("/v1/orders/:id", idem, handler), see Example). When idem is
// registered with app.Use or Group.Use, it runs before fiber has reached
// the route (c.Matched() is false, c.Route() is the middleware's own
// prefix), so the default falls back to the request path c.Path()
// ("/v1/orders/42"). That is still safe — a retry uses the same URL — but
// keys are then bound to concrete paths rather than templates; pass
// WithRoute to choose otherwise (see ExampleWithRoute).
func WithRoute(f func(c fiber.Ctx) string) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.route = f
		}
	})
}

// WithErrorHandler sets how store failures are answered (see ErrorHandler).
// Default: write fallback, an application/problem+json response (503 when
// the store is unreachable, 409 when the lease was lost to a retry); it
// never panics.
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(c *config) {
		if h != nil {
			c.onError = h
		}
	})
}
