package echoidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
)

// Option configures Middleware. Options follow the OpenTelemetry-contrib
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
type ErrorHandler func(c echo.Context, err error, fallback *core.Response) error

type config struct {
	scope   func(echo.Context) (string, error)
	skipper func(echo.Context) bool
	onError ErrorHandler
}

// WithScope sets the function returning the request's tenant, for example
// the user ID an auth middleware stored with c.Set. It is called only for
// requests idem protects; an error answers 401 (problem scope-unavailable).
// Default (and with a nil f): every request shares the scope "".
func WithScope(f func(c echo.Context) (string, error)) Option {
	return optionFunc(func(cfg *config) { cfg.scope = f })
}

// WithSkipper sets Echo's usual skipper: requests it returns true for pass
// straight to the handler, untouched by idem. Any middleware.Skipper from
// github.com/labstack/echo/v4/middleware can be passed as is.
// Default (and with a nil s): nothing is skipped.
func WithSkipper(s func(c echo.Context) bool) Option {
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

// errNoEngine is returned (inside a 500 *echo.HTTPError) by a middleware
// built with a nil engine.
var errNoEngine = errors.New("echoidem: middleware built without an engine")

func skipNothing(echo.Context) bool { return false }

func defaultErrorHandler(c echo.Context, _ error, fallback *core.Response) error {
	if fallback == nil || c.Response().Committed {
		return nil
	}
	_ = core.WriteResponse(c.Response(), fallback)
	return nil
}

// Middleware returns Echo middleware that runs the next handler at most once
// per (scope, key) and replays its response to retries. Register it with
// Echo#Use, Group#Use or on routes (not Echo#Pre: see the package
// documentation). A nil engine answers every request with a 500 error.
func Middleware(eng *core.Engine, opts ...Option) echo.MiddlewareFunc {
	cfg := config{skipper: skipNothing, onError: defaultErrorHandler}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if eng == nil {
				return &echo.HTTPError{Code: http.StatusInternalServerError, Message: http.StatusText(http.StatusInternalServerError), Internal: errNoEngine}
			}
			if cfg.skipper(c) {
				return next(c)
			}
			r := c.Request()
			route := c.Path()
			if route == "" {
				route = r.URL.Path
			}
			req := core.Request{Method: r.Method, Route: route, Target: r.URL.RequestURI(), Header: r.Header, Body: r.Body}
			if r.Body != nil && r.Body != http.NoBody {
				req.Body = bodyLimitReader{r.Body}
			}
			if scope := cfg.scope; scope != nil {
				req.ScopeFunc = func(context.Context) (string, error) { return scope(c) }
			}
			return serve(eng, &cfg, next, c, req)
		}
	}
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

func serve(eng *core.Engine, cfg *config, next echo.HandlerFunc, c echo.Context, req core.Request) error {
	r := c.Request()
	d, err := eng.Decide(r.Context(), req)
	if err != nil {
		return cfg.onError(c, err, d.Response)
	}
	if d.BodyRead {
		body := d.Body
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	switch d.Outcome {
	case core.Bypass:
		return next(c)
	case core.Replay, core.Reject:
		_ = core.WriteResponse(c.Response(), d.Response)
		return nil
	}

	res := c.Response()
	orig := res.Writer
	rec := core.NewRecorder(orig, eng.MaxResponseBytes())
	// Headers outer middleware already set (X-Request-Id, Vary, CORS) stay
	// visible to the handler through c.Response().Header(), as without idem.
	for k, v := range orig.Header() {
		rec.Header()[k] = append([]string(nil), v...)
	}
	ctx := d.Context(r.Context())
	res.Writer = rec
	c.SetRequest(r.WithContext(ctx))
	// restore hands echo back its own writer and outer middleware the
	// request whose context is not the (soon cancelled) lease context.
	restore := func() {
		res.Writer = orig
		c.SetRequest(r)
	}

	completed := false
	defer func() {
		if completed {
			return
		}
		p := recover()
		restore()
		cause := fmt.Errorf("echoidem: handler panicked: %v\n%s", p, debug.Stack())
		_ = eng.Abort(ctx, d, cause)
		if p == http.ErrAbortHandler || rec.Streaming() { //nolint:errorlint // sentinel compared as net/http does
			// The response is half out; let net/http drop the connection.
			panic(http.ErrAbortHandler)
		}
		resp := eng.PanicResponse()
		if ok, _ := rec.SendInstead(resp); ok {
			sent(res, resp.Status, len(resp.Body))
		}
	}()
	if herr := next(c); herr != nil {
		// Render the error now, into the recorder: what is stored is what
		// the client sees. Echo must not render it again, so return nil.
		c.Error(herr)
	}
	completed = true
	restore()

	result := rec.Result()
	if err := eng.Commit(ctx, d, result); err != nil {
		if rec.Streaming() {
			return nil
		}
		// The handler's response is still buffered in rec and never goes
		// out: echo's writer is pristine again for the error response.
		res.Committed = false
		res.Status = http.StatusOK
		res.Size = 0
		return cfg.onError(c, err, eng.CommitErrorResponse(err))
	}
	if rec.Streaming() {
		// Already out (flushed, hijacked or too large); echo.Response saw the
		// writes, except a flush before any of them.
		if !res.Committed {
			sent(res, rec.Status(), int(res.Size))
		}
		return nil
	}
	_ = rec.Send()
	sent(res, result.Status, len(result.Body))
	return nil
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
