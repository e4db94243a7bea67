package fiberv3idem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v3"
	"github.com/valyala/fasthttp"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
)

// New returns a fiber handler that runs the rest of the chain at most once
// per (scope, key). Mount it on the routes it protects, so that c.Route()
// is the handler's route:
//
//	idem, err := fiberv3idem.New(eng, fiberv3idem.WithScope(userID))
//	app.Post("/v1/payments", idem, createPayment)
//
// It may also be registered with app.Use or Group.Use; see WithRoute for
// how the route is then found. fiber runs such middleware before routing,
// so idem then matches the request against the app's routes itself
// (fiber.RoutePatternMatch over app.Stack(), for protected methods only):
// a request no route serves passes through to fiber's own 404 or 405
// untouched, with no key required and nothing recorded. The route is part
// of the fingerprint, in canonical form (adapterkit.CanonicalRoute):
// "/v1/orders/:id" is recorded as "/v1/orders/{id}", as every idem adapter
// records it.
//
// For a request idem lets proceed, the handler runs with c.Context()
// carrying the lease (core.KeyFromContext, core.RelayKey, pgstore.Tx);
// its response, including one the app's error handler rendered from a
// returned error, is recorded before it goes out. A handler error is not
// returned up the chain: middleware registered before idem sees a nil
// error and the rendered response.
//
// It fails without a scope (WithScope, or core.WithScope on the engine)
// unless the engine opted into core.WithSharedKeySpace, and with a nil
// engine.
func New(eng *core.Engine, opts ...Option) (fiber.Handler, error) {
	if eng == nil {
		return nil, errors.New("fiberv3idem: engine is nil")
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := eng.CheckScope("fiberv3idem.WithScope", cfg.scope != nil); err != nil {
		return nil, err
	}
	m := &middleware{eng: eng, cfg: cfg, maxBody: eng.Policy().MaxRequestBytes}
	return m.handle, nil
}

type middleware struct {
	eng *core.Engine
	cfg config
	// maxBody bounds a compressed body once decoded (boundBody): the
	// engine's request limit, core.WithMaxRequestBytes.
	maxBody int64
}

func (m *middleware) handle(c fiber.Ctx) error {
	if m.cfg.skip != nil && m.cfg.skip(c) {
		return c.Next()
	}
	// c.Matched(): a route (not an app.Use prefix) has been reached, so
	// c.Route() is the handler's. Before that, idem runs as app.Use or
	// Group.Use middleware, for paths no route serves too.
	routed := c.Matched()
	req := core.Request{
		Method: c.Method(), // one of the app's RequestMethods: no buffer behind it
		// Hashed inside Decide, never kept: no copy needed beyond string().
		Target: string(c.Request().RequestURI()),
		// Read on demand: only the headers the engine needs are copied.
		HeaderReader: requestHeaders{&c.Request().Header},
	}
	switch {
	case m.cfg.route != nil:
		req.Route = strings.Clone(m.cfg.route(c)) // it may alias fasthttp's buffers
	case routed:
		req.Route = c.Route().Path // owned by the app, stable
	} // else none: the path stands in (core.Request.Route)
	if !routed {
		req.NoRoute = func() bool { return !routeFor(c) }
	}
	var stream *streamBody
	if c.Request().IsBodyStream() {
		// fiber.Config.StreamRequestBody: read by the engine up to its
		// limit, and given back to the handler (Next).
		stream = &streamBody{r: c.Request().BodyStream()}
		req.Body = stream
	} else {
		// The body as received, never c.Body(), which inflates a
		// compressed body without bound: every adapter fingerprints the
		// bytes on the wire. Hashed in place, only for a request the
		// engine protects.
		req.Body = adapterkit.BodyBytes(c.Request().Body)
	}
	if scope := m.cfg.scope; scope != nil {
		req.ScopeFunc = func(context.Context, *core.Request) (string, error) {
			s, err := scope(c)
			return strings.Clone(s), err
		}
	}
	x := &exchange{m: m, c: c}
	err := m.eng.Serve(c.Context(), req, x)
	if stream != nil && stream.started && !stream.done {
		// Refused part-way (over the limit, unreadable): the rest of the
		// body is still on the connection, which cannot carry another
		// request.
		c.RequestCtx().SetConnectionClose()
	}
	if x.saved != nil {
		headerPool.Put(x.saved)
	}
	return err
}

// useField is the index of fiber.Route's unexported "use" flag (a route
// registered with app.Use, Group.Use or app.Mount: a path prefix, not a
// route), which fiber exposes no other way (GetRoutes(true) copies every
// route). nil if a fiber release renames it: every route then counts,
// and a request to a Use prefix itself is protected, never let through.
var useField = func() []int {
	f, ok := reflect.TypeFor[fiber.Route]().FieldByName("use")
	if !ok || f.Type.Kind() != reflect.Bool {
		return nil
	}
	return f.Index
}()

func isUse(r *fiber.Route) bool {
	return useField != nil && reflect.ValueOf(r).Elem().FieldByIndex(useField).Bool()
}

// routeFor reports whether a route (not a Use prefix) of c's app matches
// the request's method and path, as fiber's router will find it: the
// router's own matching (fiber.RoutePatternMatch), on the path as fiber
// prepares it (trailing slashes dropped unless StrictRouting). Asked only
// for requests idem protects: it walks the method's routes.
func routeFor(c fiber.Ctx) bool {
	app := c.App()
	cfg := app.Config()
	stack := app.Stack()
	path := c.Path()
	if !cfg.StrictRouting && len(path) > 1 {
		if path = strings.TrimRight(path, "/"); path == "" {
			path = "/"
		}
	}
	for i, m := range cfg.RequestMethods {
		if m != c.Method() || i >= len(stack) {
			continue
		}
		for _, r := range stack[i] {
			if !isUse(r) && fiber.RoutePatternMatch(path, r.Path, cfg) {
				return true
			}
		}
	}
	return false
}

// streamBody tells whether a streamed request body was read to its end.
type streamBody struct {
	r             io.Reader
	started, done bool
}

func (b *streamBody) Read(p []byte) (int, error) {
	b.started = true
	n, err := b.r.Read(p)
	if err == io.EOF { //nolint:errorlint // io.EOF is returned unwrapped
		b.done = true
	}
	return n, err
}

// exchange translates one request for core.Engine.Serve.
type exchange struct {
	m     *middleware
	c     fiber.Ctx
	saved *fasthttp.ResponseHeader // Proceed only: the headers before the handler
	// maxResponse is the engine's response limit (Proceed only).
	maxResponse int
}

func (x *exchange) Next(ctx context.Context, d *adapterkit.Proceed) error {
	c := x.c
	if d != nil {
		x.maxResponse = d.MaxResponseBytes
		if d.BodyRead {
			c.Request().SetBodyRaw(d.Body) // the stream the engine read
		}
	}
	if err := boundBody(c, x.m.maxBody); err != nil {
		// Rendered and, for a protected request, recorded like a
		// handler's error: the same bytes always get the same answer.
		if d != nil {
			x.saved = snapshotHeader(&c.Response().Header)
			x.render(err)
		}
		return err
	}
	if d == nil {
		return c.Next()
	}
	parent := c.Context()
	c.SetContext(ctx)
	// The lease context ends with the execution; outer middleware gets its
	// own context back.
	defer c.SetContext(parent)
	// What earlier middleware put in the response (CORS, request ID) before
	// calling us, so that a problem written instead of the handler's
	// response keeps it but drops the handler's headers and cookies.
	x.saved = snapshotHeader(&c.Response().Header)
	herr := c.Next()
	if herr != nil {
		// Render the error now, exactly as fiber would after the chain
		// returns, so that the recorded response is the one the client gets.
		x.render(herr)
	}
	return herr
}

// render answers err with the app's error handler (c.App().ErrorHandler
// honours mounted sub-apps), as fiber does after the chain.
func (x *exchange) render(err error) {
	if catch := x.c.App().ErrorHandler(x.c, err); catch != nil {
		_ = x.c.SendStatus(fiber.StatusInternalServerError)
	}
}

// Captured reads the response the handler left in c.Response(). What the
// engine gets is copied (the body here, header values by responseHeaders):
// fasthttp reuses the buffers for the next request.
func (x *exchange) Captured() adapterkit.Response {
	r := x.c.Response()
	resp := adapterkit.Response{Status: r.StatusCode()}
	// A body stream (c.SendStream, c.SendStreamWriter, c.SendFile of a
	// large file) is produced while the response is written, after we
	// return; a hijacked connection is the handler's. Neither can be kept.
	if r.IsBodyStream() || x.c.RequestCtx().Hijacked() {
		resp.Streamed = true
		return resp
	}
	body := r.Body()
	if len(body) > x.maxResponse {
		resp.Truncated = true
		return resp
	}
	if len(body) == 0 && untouched(x.saved, &r.Header) {
		resp.Status = 0 // answered nothing (see untouched)
	}
	resp.Body = bytes.Clone(body)
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	resp.HeaderReader = responseHeaders{h: &r.Header, noType: len(body) == 0 && implicitContentType(x.c)}
	return resp
}

// Send has nothing to do: fiber sends c.Response() once the chain returns.
func (x *exchange) Send() error { return nil }

// Discard drops the handler's response (headers, cookies, status, body or
// body stream, hijack handler) and puts back the headers earlier middleware
// set. Nothing has gone out before the chain returns, so it always
// succeeds.
func (x *exchange) Discard() bool {
	if x.saved != nil {
		r := x.c.Response()
		r.ResetBody()
		x.saved.CopyTo(&r.Header)
		// A hijack runs once the chain returned, in place of (or after) the
		// response: the handler's answer too.
		x.c.RequestCtx().Hijack(nil)
		x.c.RequestCtx().HijackSetNoResponse(false)
	}
	return true
}

// Write writes resp with fiber's API: its headers (replacing any of the
// same name), status and body. The body is copied into fasthttp's own
// buffer: a replay's body is the store's, and later middleware may edit
// c.Response().Body() in place.
func (x *exchange) Write(resp *adapterkit.Response) error {
	c := x.c
	for k, vs := range resp.Header {
		for i, v := range vs {
			if i == 0 {
				c.Set(k, v)
			} else {
				c.Response().Header.Add(k, v)
			}
		}
	}
	status := resp.Status
	if status == 0 {
		status = fiber.StatusOK
	}
	c.Status(status).Response().SetBody(resp.Body)
	return nil
}

func (x *exchange) OnError(err error, fallback *adapterkit.Response) (bool, error) {
	if x.m.cfg.onError == nil {
		return false, nil
	}
	r := x.c.Response()
	rerr := x.m.cfg.onError(x.c, err, fallback)
	return rerr != nil || r.StatusCode() != fiber.StatusOK || len(r.Body()) > 0 || r.IsBodyStream(), rerr
}

var headerPool = sync.Pool{New: func() any { return new(fasthttp.ResponseHeader) }}

// untouched reports whether the handler left the response header as
// earlier middleware had it (saved): with no body, it answered nothing, as
// a net/http handler that writes nothing. fasthttp reports 200 for a
// status nobody set, and the engine must tell "nothing" from an answer (a
// handler that gave up on its cancelled context must not be recorded as a
// success).
func untouched(saved, now *fasthttp.ResponseHeader) bool {
	return saved != nil && bytes.Equal(saved.Header(), now.Header())
}

func snapshotHeader(h *fasthttp.ResponseHeader) *fasthttp.ResponseHeader {
	s, _ := headerPool.Get().(*fasthttp.ResponseHeader)
	if s == nil {
		s = new(fasthttp.ResponseHeader)
	}
	h.CopyTo(s)
	return s
}
