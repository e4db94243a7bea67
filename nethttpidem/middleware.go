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
	route   func(*http.Request) string // nil: r.Pattern, or the mux's pattern
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
// fingerprint, in canonical form (adapterkit.CanonicalRoute). An empty result
// means no route is known: the path is used, as without a pattern.
// Default: r.Pattern, set by the router that routed the request before the
// middleware ran (http.ServeMux, whose method and host prefix are dropped;
// chi on a route, see New), or, around a whole *http.ServeMux, the pattern
// the mux will route to; else none: the path is recorded in its place,
// and observers are not told it (core.Request.Route).
//
// Mounted on a chi router with r.Use, before chi routes, ask the router
// (and skip the requests it has no route for, which chi answers 404 or
// 405):
//
//	find := func(r *http.Request) string {
//		return router.Find(chi.NewRouteContext(), r.Method, r.URL.Path)
//	}
//	mw, err := nethttpidem.New(eng, nethttpidem.WithScope(scope),
//		nethttpidem.WithRoute(find),
//		nethttpidem.WithSkip(func(r *http.Request) bool { return find(r) == "" }))
//	...
//	router.Use(mw)
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

// routerPattern escapes a router's pattern for adapterkit.CanonicalRoute, which
// reads ':' and '*' as parameters (gin, echo, fiber): in a ServeMux
// pattern both are literal characters, and so is chi's ':' outside
// braces. chi, which sets r.Pattern to its own pattern once it has routed
// (v5.2 and later), has two spellings ServeMux does not: "{name:regexp}"
// (ServeMux wildcard names hold no ':') and a catch-all "*" ending a
// pattern that starts with '/'. Both are kept, so a chi route is recorded
// as every adapter records it. A ServeMux pattern without a method ending
// in a literal "/*" segment is read as chi's catch-all too; it still
// records one route per pattern.
func routerPattern(p string) string {
	if !strings.ContainsAny(p, `\:*`) {
		return p
	}
	chiStar := strings.HasPrefix(p, "/") && strings.HasSuffix(p, "/*")
	var b strings.Builder
	b.Grow(len(p) + 4)
	depth := 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '{':
			depth++
		case c == '}' && depth > 0:
			depth--
		case depth > 0:
			// Inside a wildcard: a chi regexp, kept as written.
		case c == '\\', c == ':', c == '*' && !(chiStar && i == len(p)-1):
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
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

// New returns net/http middleware that runs next at most once per (scope,
// key). Mount it where the router has already chosen the route, so that
// the route template, not the path, is recorded and fingerprinted (a fleet
// mixing frameworks then agrees on every record) and requests no route
// serves never reach it:
//
//   - http.ServeMux: around the handlers themselves (mux.Handle("POST
//     /v1/payments/{id}", mw(h))): r.Pattern gives the route. Or around the
//     whole mux (http.ListenAndServe(addr, mw(mux))): the middleware asks
//     the mux (ServeMux.Handler) which pattern will serve the request; a
//     request none matches gets the mux's own 404, 405 or redirect,
//     untouched (no key required, nothing recorded).
//   - chi: on the routes, r.With(mw).Post("/v1/payments/{id}", h), or with
//     r.Use inside r.Group: chi sets r.Pattern once it has routed, and runs
//     these after routing. Not with r.Use on a router or inside r.Route:
//     that middleware runs before the router routes (r.Pattern is empty,
//     or the mount pattern "/v1/*" of a sub-router); there, give the
//     route with WithRoute and chi's Router.Find, and pass what it does not
//     find through with WithSkip on the same lookup.
//
// Around any other handler that routes, the middleware cannot know whether
// a route matches: it protects every request it sees, under the path as
// its route, so a POST to a path nothing serves answers 400 without a key
// and records one with it; skip unknown paths with WithSkip.
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
					req.Route = routerPattern(pattern)
				}
			case cfg.route != nil:
				req.Route = cfg.route(r) // "": no route found, the path stands in
			case r.Pattern != "":
				req.Route = routerPattern(r.Pattern)
			}
			// Else no pattern: the middleware wraps a handler that routes
			// after it (not a ServeMux); the path stands in for the route.
			if cfg.scope != nil {
				req.ScopeFunc = func(context.Context, *core.Request) (string, error) { return cfg.scope(r) }
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
