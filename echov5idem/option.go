package echov5idem

import (
	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core/adapterkit"
)

// Option configures New. Options follow the OpenTelemetry-contrib
// style; a nil Option is ignored, and so is an option given a nil
// function: the default stays in place.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// ErrorHandler answers a request when idem cannot do its job: the store
// could not be reached (the handler did not run) or the handler's outcome
// could not be recorded (its response is discarded). fallback is the
// problem response idem would write (503, or 409 when the lease was lost).
//
// It may write a response through c and return nil, or return an error
// (for example echo.ErrServiceUnavailable) for Echo's HTTPErrorHandler to
// render.
type ErrorHandler func(c *echo.Context, err error, fallback *adapterkit.Response) error

type config struct {
	scope   func(*echo.Context) (string, error)
	skipper func(*echo.Context) bool
	onError ErrorHandler
}

// WithScope sets the function returning the request's tenant, for example
// the user ID an auth middleware stored with c.Set. It is called only for
// requests idem protects; an error answers 401 (problem scope-unavailable;
// the error is logged and in the observer's event). Required: New fails
// without it, unless the engine has core.WithScope or
// core.WithSharedKeySpace.
func WithScope(f func(c *echo.Context) (string, error)) Option {
	return optionFunc(func(cfg *config) {
		if f != nil {
			cfg.scope = f
		}
	})
}

// WithSkip takes Echo's usual skipper: requests it returns true for pass
// straight to the handler, untouched by idem. Any middleware.Skipper from
// github.com/labstack/echo/v5/middleware can be passed as is.
// Default: nothing is skipped.
func WithSkip(s func(c *echo.Context) bool) Option {
	return optionFunc(func(cfg *config) {
		if s != nil {
			cfg.skipper = s
		}
	})
}

// WithErrorHandler sets how store failures are answered (see
// ErrorHandler). Default: write the fallback application/problem+json
// response through c.Response().
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(cfg *config) {
		if h != nil {
			cfg.onError = h
		}
	})
}
