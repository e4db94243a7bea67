package echov5idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core"
)

// New returns Echo v5 middleware that runs the next handler at most once
// per (scope, key) and replays its response to retries. Register it with
// Echo#Use, Group#Use or on routes (see the package documentation for
// Echo#Pre). A request no route serves passes through to echo's own 404 or
// 405 (or a RouteNotFound handler) untouched. The route template
// (c.Path()) is part of the fingerprint, in canonical form
// (adapterkit.CanonicalRoute): "/v1/orders/:id" is recorded as
// "/v1/orders/{id}", as every idem adapter records it.
//
// It fails without a scope (WithScope, or core.WithScope on the engine)
// unless the engine opted into core.WithSharedKeySpace, and with a nil
// engine.
func New(eng *core.Engine, opts ...Option) (echo.MiddlewareFunc, error) {
	if eng == nil {
		return nil, errors.New("echov5idem: engine is nil")
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := eng.CheckScope("echov5idem.WithScope", cfg.scope != nil); err != nil {
		return nil, err
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			if cfg.skipper != nil && cfg.skipper(c) {
				return next(c)
			}
			r := c.Request()
			req := core.Request{Method: r.Method, Route: c.Path(), Target: r.URL.RequestURI(), Header: r.Header, Body: r.Body,
				NoRoute: func() bool { return !routed(c) }}
			// c.Path() is "" before routing (Echo#Pre) or when nothing
			// matched: the path then stands in for the route.
			if r.Body != nil && r.Body != http.NoBody {
				req.Body = bodyLimitReader{r.Body}
			}
			if scope := cfg.scope; scope != nil {
				req.ScopeFunc = func(context.Context, *core.Request) (string, error) { return scope(c) }
			}
			return eng.Serve(r.Context(), req, &exchange{c: c, next: next, onError: cfg.onError})
		}
	}, nil
}

// routed reports whether a route serves c's request. Echo v5's router
// says so in c.RouteInfo(): for a 404 or 405 it names no method (and
// echo's not-found or method-not-allowed route), for a RouteNotFound
// handler (Group#Use registers catch-all ones) the RouteNotFound method.
// Before routing (Echo#Pre) the RouteInfo is empty, name included: the
// router has not decided, so the request counts as routed and is
// protected rather than let through unchecked.
func routed(c *echo.Context) bool {
	ri := c.RouteInfo()
	switch {
	case ri.Method == "" && ri.Name == "":
		return true // not routed yet (Echo#Pre)
	case ri.Method == "", ri.Method == echo.RouteNotFound:
		return false
	}
	return true
}

// bodyLimitReader reports Echo's BodyLimit overflow (middleware.BodyLimit
// fails the read with a 413 error) as http.MaxBytesReader does, so the
// engine answers 413 body-too-large rather than 400 body-unreadable.
type bodyLimitReader struct{ r io.Reader }

func (b bodyLimitReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && echo.StatusCode(err) == http.StatusRequestEntityTooLarge { //nolint:errorlint // io.EOF is returned unwrapped
		err = fmt.Errorf("echov5idem: %w: %w", err, &http.MaxBytesError{})
	}
	return n, err
}
