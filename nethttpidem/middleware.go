package nethttpidem

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
)

// Option configures New. A nil Option is ignored, and so is an option
// given a nil function: the default stays in place.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// ErrorHandler writes the response when idem cannot do its job: the store
// is unreachable (Decide failed) or the outcome could not be recorded
// (Commit failed). fallback is the problem response idem would write. A
// handler that writes nothing gets fallback written for it: a request that
// did not complete never looks like a success.
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error, fallback *adapterkit.Response)

type config struct {
	scope   func(*http.Request) (string, error)
	skip    func(*http.Request) bool
	route   func(*http.Request) string // nil: the default (defaultRoute)
	onError ErrorHandler
}

// WithScope sets the function returning the request's tenant (for example
// the user ID an auth middleware put in the context). Records are keyed by
// (scope, key). An error answers 401 (logged, and in the observer's event).
// Required: New fails without it, unless the engine has core.WithScope or
// core.WithSharedKeySpace.
func WithScope(f func(*http.Request) (string, error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.scope = f
		}
	})
}

// WithSkip sets a predicate for requests idem must not touch at all.
// Default: none skipped.
func WithSkip(f func(*http.Request) bool) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.skip = f
		}
	})
}

// WithRoute sets how the route template is found; it is part of the
// fingerprint, in canonical form (core.CanonicalRoute). With chi, use
// chi.RouteContext(r.Context()).RoutePattern(). Default: r.Pattern (set by
// http.ServeMux for handlers it routed to; its method prefix is dropped),
// or, around a whole *http.ServeMux, the pattern the mux will route to;
// else r.URL.Path, which observers are not told (core.Request.RouteIsPath).
func WithRoute(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.route = f
		}
	})
}

// WithErrorHandler sets how store and commit failures are answered (see
// ErrorHandler). Default: the fallback problem+json response.
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(c *config) {
		if h != nil {
			c.onError = h
		}
	})
}

// defaultRoute is ServeMux's pattern, whose ':' and '*' are literal
// characters (escaped for core.CanonicalRoute), else the path.
func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return muxEscaper.Replace(r.Pattern)
	}
	return r.URL.Path
}

// redirectType is the type of ServeMux's own redirects (/tree to /tree/,
// unclean paths): answers of the mux, not of a route.
var redirectType = reflect.TypeOf(http.RedirectHandler("/", http.StatusTemporaryRedirect))

// muxRoute finds what mux will do with r, as mux.ServeHTTP will: the
// pattern that matches, or ok false when none does (the mux answers 404,
// 405 or a redirect itself).
func muxRoute(mux *http.ServeMux, r *http.Request) (pattern string, ok bool) {
	h, pattern := mux.Handler(r)
	if pattern == "" || reflect.TypeOf(h) == redirectType {
		return "", false
	}
	return pattern, true
}

// noRoute is core.Request.NoRoute for a request known to match nothing.
func noRoute() bool { return true }

var muxEscaper = strings.NewReplacer(`\`, `\\`, `:`, `\:`, `*`, `\*`)

// New returns net/http middleware (chi-compatible) that runs next at most
// once per (scope, key). Mount it one of two ways:
//
//   - around the handlers themselves (mux.Handle("POST /v1/payments",
//     mw(h))), so r.Pattern gives the route and requests no pattern
//     matches never reach it;
//   - around a whole *http.ServeMux (http.ListenAndServe(addr, mw(mux))):
//     the middleware asks the mux (ServeMux.Handler) which pattern will
//     serve the request; a request none matches gets the mux's own 404,
//     405 or redirect, untouched (no key required, nothing recorded).
//
// Around any other handler that routes (chi's router, a handler chain
// ending in a mux), the middleware cannot know whether a route matches: it
// protects every request it sees, under the path as its route, so a POST
// to a path nothing serves answers 400 without a key and records one with
// it. Mount it inside the router there (chi: r.With(mw).Post(...) or
// r.Use inside a r.Route/r.Group, with WithRoute giving the pattern), or
// skip unknown paths with WithSkip.
//
// It fails without a scope (WithScope, or core.WithScope on the engine)
// unless the engine opted into core.WithSharedKeySpace, and with a nil
// engine.
func New(eng *core.Engine, opts ...Option) (func(http.Handler) http.Handler, error) {
	if eng == nil {
		return nil, errors.New("nethttpidem: engine is nil")
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := eng.CheckScope("nethttpidem.WithScope", cfg.scope != nil); err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		mux, _ := next.(*http.ServeMux) // wrapped around the whole mux
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if cfg.skip != nil && cfg.skip(r) {
				next.ServeHTTP(w, r)
				return
			}
			req := core.Request{Method: r.Method, Target: r.URL.RequestURI(), Header: r.Header, Body: r.Body}
			switch {
			case mux != nil:
				pattern, ok := muxRoute(mux, r)
				if !ok {
					req.NoRoute = noRoute
				}
				if cfg.route != nil {
					req.Route = cfg.route(r)
				} else if ok {
					req.Route = muxEscaper.Replace(pattern)
				} else {
					req.Route, req.RouteIsPath = r.URL.Path, true
				}
			case cfg.route != nil:
				req.Route = cfg.route(r)
			default:
				// No pattern: the middleware wraps a handler that routes
				// after it (not a ServeMux); the route is the path.
				req.Route, req.RouteIsPath = defaultRoute(r), r.Pattern == ""
			}
			if cfg.scope != nil {
				req.ScopeFunc = func(context.Context) (string, error) { return cfg.scope(r) }
			}
			_ = eng.Serve(r.Context(), req, &exchange{w: w, r: r, next: next, onError: cfg.onError})
		})
	}, nil
}

// exchange translates one request for core.Engine.Serve.
type exchange struct {
	w       http.ResponseWriter
	r       *http.Request
	next    http.Handler
	onError ErrorHandler
	rec     *adapterkit.Recorder // Proceed only
}

func (x *exchange) Next(ctx context.Context, d *adapterkit.Proceed) error {
	if d == nil {
		x.next.ServeHTTP(x.w, x.r) // Decide left the body unread
		return nil
	}
	d.RestoreBody(x.r)
	x.rec = adapterkit.NewRecorder(x.w, d.MaxResponseBytes)
	x.next.ServeHTTP(x.rec, x.r.WithContext(ctx))
	return nil
}

func (x *exchange) Captured() adapterkit.Response { return x.rec.Result() }

func (x *exchange) Send() error { return x.rec.Send() }

func (x *exchange) Discard() bool { return x.rec == nil || !x.rec.Streaming() }

func (x *exchange) Write(resp *adapterkit.Response) error {
	if x.rec != nil {
		_, err := x.rec.SendInstead(resp)
		return err
	}
	return adapterkit.WriteResponse(x.w, resp)
}

func (x *exchange) OnError(err error, fallback *adapterkit.Response) (bool, error) {
	if x.onError == nil {
		return false, nil
	}
	tw := &trackingWriter{ResponseWriter: x.w}
	x.onError(tw, x.r, err, fallback)
	return tw.wrote, nil
}

// trackingWriter tells whether an error handler wrote anything.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackingWriter) WriteHeader(code int) {
	t.wrote = true
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(p []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(p)
}

// Unwrap returns the wrapped writer (http.ResponseController).
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }
