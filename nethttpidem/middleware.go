package nethttpidem

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"

	"github.com/idemkit/idem/core"
)

// Option configures Middleware. A nil Option is ignored.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// ErrorHandler writes the response when idem cannot do its job: the store
// is unreachable (Decide failed) or the outcome could not be recorded
// (Commit failed). fallback is the problem response idem would write.
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error, fallback *core.Response)

type config struct {
	scope   func(*http.Request) (string, error)
	skip    func(*http.Request) bool
	route   func(*http.Request) string
	onError ErrorHandler
}

// WithScope sets the function returning the request's tenant (for example
// the user ID an auth middleware put in the context). An error answers 401.
// Default: every request shares the scope "".
func WithScope(f func(*http.Request) (string, error)) Option {
	return optionFunc(func(c *config) { c.scope = f })
}

// WithSkip sets a predicate for requests idem must not touch at all.
// Default: none skipped.
func WithSkip(f func(*http.Request) bool) Option {
	return optionFunc(func(c *config) { c.skip = f })
}

// WithRoute sets how the route template is found; it is part of the
// fingerprint. With chi, use chi.RouteContext(r.Context()).RoutePattern().
// Default: r.Pattern (set by http.ServeMux for handlers it routed to), else
// r.URL.Path.
func WithRoute(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) { c.route = f })
}

// WithErrorHandler sets how store failures are answered.
// Default: the fallback problem+json response.
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(c *config) { c.onError = h })
}

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}

// Middleware returns net/http middleware (chi-compatible) that runs next at
// most once per (scope, key). Register it around the handlers themselves
// (mux.Handle("POST /v1/payments", mw(h))) so r.Pattern gives the route.
func Middleware(eng *core.Engine, opts ...Option) func(http.Handler) http.Handler {
	cfg := config{
		route: defaultRoute,
		onError: func(w http.ResponseWriter, _ *http.Request, _ error, fallback *core.Response) {
			_ = core.WriteResponse(w, fallback)
		},
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if eng == nil {
				http.Error(w, "idem: middleware built without an engine", http.StatusInternalServerError)
				return
			}
			if cfg.skip != nil && cfg.skip(r) {
				next.ServeHTTP(w, r)
				return
			}
			req := core.Request{Method: r.Method, Route: cfg.route(r), Target: r.URL.RequestURI(), Header: r.Header, Body: r.Body}
			if cfg.scope != nil {
				req.ScopeFunc = func(context.Context) (string, error) { return cfg.scope(r) }
			}
			serve(eng, &cfg, next, w, r, req)
		})
	}
}

func serve(eng *core.Engine, cfg *config, next http.Handler, w http.ResponseWriter, r *http.Request, req core.Request) {
	d, err := eng.Decide(r.Context(), req)
	if err != nil {
		cfg.onError(w, r, err, d.Response)
		return
	}
	switch d.Outcome {
	case core.Bypass:
		next.ServeHTTP(w, r) // Decide left the body unread
		return
	case core.Replay, core.Reject:
		_ = core.WriteResponse(w, d.Response)
		return
	}
	if d.BodyRead { // the handler gets the body Decide read
		r.Body = io.NopCloser(bytes.NewReader(d.Body))
		r.ContentLength = int64(len(d.Body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(d.Body)), nil }
	}

	rec := core.NewRecorder(w, eng.MaxResponseBytes())
	// Headers outer middleware already set (Vary: Origin, X-Request-Id) stay
	// visible to the handler, and what it adds to them is added, as without
	// idem; the recorder's copy replaces them only with its response.
	for k, v := range w.Header() {
		rec.Header()[k] = append([]string(nil), v...)
	}
	r = r.WithContext(d.Context(r.Context()))
	completed := false
	defer func() {
		if completed {
			return
		}
		p := recover()
		cause := fmt.Errorf("nethttpidem: handler panicked: %v\n%s", p, debug.Stack())
		_ = eng.Abort(r.Context(), d, cause)
		if p == http.ErrAbortHandler || rec.Streaming() { //nolint:errorlint // sentinel compared as net/http does
			// The response is half out; let net/http drop the connection.
			panic(http.ErrAbortHandler)
		}
		_, _ = rec.SendInstead(eng.PanicResponse())
	}()
	next.ServeHTTP(rec, r)
	completed = true

	if err := eng.Commit(r.Context(), d, rec.Result()); err != nil {
		if !rec.Streaming() {
			// The handler's response is still buffered in rec and never goes
			// out: answer on the real writer instead.
			cfg.onError(w, r, err, eng.CommitErrorResponse(err))
		}
		return
	}
	_ = rec.Send()
}
