package echoidem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
)

// Option configures New. Options follow the OpenTelemetry-contrib
// style; a nil Option is ignored.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// ErrorHandler answers a request when idem cannot do its job: the store
// could not be reached (the handler did not run) or the handler's outcome
// could not be recorded (its response is discarded). fallback is the
// problem response idem would write (503, or 409 when the lease was lost).
//
// It may write a response through c and return nil, or return an error
// (for example an *echo.HTTPError) for Echo's HTTPErrorHandler to render.
type ErrorHandler func(c echo.Context, err error, fallback *adapterkit.Response) error

type config struct {
	scope   func(echo.Context) (string, error)
	skipper func(echo.Context) bool
	onError ErrorHandler
}

// WithScope sets the function returning the request's tenant, for example
// the user ID an auth middleware stored with c.Set. It is called only for
// requests idem protects; an error answers 401 (problem scope-unavailable;
// the error is logged and in the observer's event). Required: New fails
// without it (a nil f counts as without), unless the engine has
// core.WithScope or core.WithSharedKeySpace.
func WithScope(f func(c echo.Context) (string, error)) Option {
	return optionFunc(func(cfg *config) {
		if f != nil {
			cfg.scope = f
		}
	})
}

// WithSkip takes Echo's usual skipper: requests it returns true for pass
// straight to the handler, untouched by idem. Any middleware.Skipper from
// github.com/labstack/echo/v4/middleware can be passed as is.
// Default (and with a nil s): nothing is skipped.
func WithSkip(s func(c echo.Context) bool) Option {
	return optionFunc(func(cfg *config) {
		if s != nil {
			cfg.skipper = s
		}
	})
}

// WithErrorHandler sets how store failures are answered (see ErrorHandler).
// Default (and with a nil h): write the fallback application/problem+json
// response through c.Response().
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(cfg *config) {
		if h != nil {
			cfg.onError = h
		}
	})
}

// New returns Echo middleware that runs the next handler at most once per
// (scope, key) and replays its response to retries. Register it with
// Echo#Use, Group#Use or on routes (not Echo#Pre: see the package
// documentation). A request no route serves passes through to echo's own
// 404 or 405 (or a RouteNotFound handler) untouched. The route template (c.Path()) is part of the fingerprint,
// in canonical form (adapterkit.CanonicalRoute).
//
// It fails without a scope (WithScope, or core.WithScope on the engine)
// unless the engine opted into core.WithSharedKeySpace, and with a nil
// engine.
func New(eng *core.Engine, opts ...Option) (echo.MiddlewareFunc, error) {
	if eng == nil {
		return nil, errors.New("echoidem: engine is nil")
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := eng.CheckScope("echoidem.WithScope", cfg.scope != nil); err != nil {
		return nil, err
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if cfg.skipper != nil && cfg.skipper(c) {
				return next(c)
			}
			r := c.Request()
			// c.Path() is "" before routing (Echo#Pre) or when nothing
			// matched: the path then stands in for the route.
			req := core.Request{Method: r.Method, Route: c.Path(), Target: r.URL.RequestURI(), Header: r.Header, Body: r.Body,
				NoRoute: func() bool { return !routed(c) }}
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

// routed reports whether a route serves c's request: the router holds one
// for the request's method at c.Path(). For a request no route serves, echo
// runs the middleware of e.Use (and of Group.Use, through the group's
// catch-all RouteNotFound routes) around its NotFoundHandler,
// MethodNotAllowedHandler or a RouteNotFound handler, with c.Path() the
// nearest registered path, or "". Under Echo#Pre the router has not run
// and c.Path() is "" as for a miss: the router is asked on a scratch
// context then. Asked only for requests idem protects: it walks the
// router's routes.
func routed(c echo.Context) bool {
	e := c.Echo()
	if e == nil {
		return c.Path() != "" // a context made without an Echo: no router to ask
	}
	r := c.Request()
	router := e.Router()
	if hr, ok := e.Routers()[r.Host]; ok {
		router = hr
	}
	path := c.Path()
	if path == "" {
		// Not routed yet (Echo#Pre), or nothing matched: find out.
		scratch := e.NewContext(r, nil)
		router.Find(r.Method, echo.GetPath(r), scratch)
		if path = scratch.Path(); path == "" {
			return false
		}
	}
	for _, rt := range router.Routes() {
		if rt.Method == r.Method && rt.Path == path {
			return true
		}
	}
	return false
}

// bodyLimitReader reports Echo's BodyLimit overflow (middleware.BodyLimit
// fails the read of a body without Content-Length with a 413
// *echo.HTTPError) as http.MaxBytesReader does, so the engine answers 413
// body-too-large rather than 400 body-unreadable.
type bodyLimitReader struct{ r io.Reader }

func (b bodyLimitReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF { //nolint:errorlint // io.EOF is returned unwrapped
		var he *echo.HTTPError
		if errors.As(err, &he) && he.Code == http.StatusRequestEntityTooLarge {
			err = fmt.Errorf("echoidem: %w: %w", err, &http.MaxBytesError{})
		}
	}
	return n, err
}

// exchange translates one request for core.Engine.Serve.
type exchange struct {
	c       echo.Context
	next    echo.HandlerFunc
	onError ErrorHandler
	rec     *adapterkit.Recorder // Proceed only
}

func (x *exchange) Next(ctx context.Context, d *adapterkit.Proceed) error {
	c := x.c
	if d == nil {
		return x.next(c)
	}
	r := c.Request()
	d.RestoreBody(r)
	res := c.Response()
	orig := res.Writer
	x.rec = adapterkit.NewRecorder(orig, d.MaxResponseBytes)
	res.Writer = x.rec
	c.SetRequest(r.WithContext(ctx))
	defer func() {
		// echo gets its own writer back, and outer middleware the request
		// whose context is not the (soon cancelled) lease context.
		res.Writer = orig
		c.SetRequest(r)
	}()
	herr := x.next(c)
	if herr != nil {
		// Render the error now, into the capture: what is stored is what
		// the client sees. Echo must not render it again: Serve returns nil.
		c.Error(herr)
	}
	return herr
}

func (x *exchange) Captured() adapterkit.Response { return x.rec.Result() }

func (x *exchange) Send() error {
	res := x.c.Response()
	if x.rec.Streaming() {
		// Already out (flushed, hijacked or too large); echo.Response saw the
		// writes, except a flush before any of them.
		if !res.Committed {
			sent(res, x.rec.Status(), int(res.Size))
		}
		return nil
	}
	result := x.rec.Result()
	err := x.rec.Send()
	sent(res, result.Status, len(result.Body))
	return err
}

// Discard makes echo's writer pristine again: the handler's writes went
// into the capture, which is dropped.
func (x *exchange) Discard() bool {
	if x.rec != nil && x.rec.Streaming() {
		return false
	}
	res := x.c.Response()
	res.Committed = false
	res.Status = http.StatusOK
	res.Size = 0
	return true
}

func (x *exchange) Write(resp *adapterkit.Response) error {
	return adapterkit.WriteResponse(x.c.Response(), resp)
}

func (x *exchange) OnError(err error, fallback *adapterkit.Response) (bool, error) {
	if x.onError == nil {
		return false, nil
	}
	rerr := x.onError(x.c, err, fallback)
	return rerr != nil || x.c.Response().Committed, rerr
}

// sent makes echo.Response describe a response written past it (straight to
// its underlying writer), so that outer middleware and the error handler see
// it as committed with the right status and size.
func sent(res *echo.Response, status, size int) {
	if status == 0 {
		status = http.StatusOK
	}
	res.Status = status
	res.Size = int64(size)
	res.Committed = true
}
