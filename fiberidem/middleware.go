package fiberidem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
)

// New returns a fiber handler that runs the rest of the chain at most once
// per (scope, key). Mount it on the routes it protects, so that c.Route()
// is the handler's route:
//
//	idem, err := fiberidem.New(eng, fiberidem.WithScope(userID))
//	app.Post("/v1/payments", idem, createPayment)
//
// It may also be registered with app.Use or Group.Use; see WithRoute for
// how the route is then found. fiber runs such middleware before routing,
// so idem then matches the request against the app's routes itself
// (fiber.RoutePatternMatch over app.Stack(), for protected methods only):
// a request no route serves passes through to fiber's own 404 or 405
// untouched, with no key required and nothing recorded. Mounting on the
// routes (or on a Group's routes: grp.Post(path, idem, h)) needs no such
// lookup and is cheaper. The route is part of the fingerprint, in
// canonical form (adapterkit.CanonicalRoute).
//
// The request body is fingerprinted as received (a gzip body compressed,
// as the other adapters hash it), read only for a request idem protects
// and only after its method, key and scope checks.
//
// For a request idem lets proceed, the handler runs with c.UserContext()
// carrying the lease (core.KeyFromContext, core.RelayKey, pgstore.Tx); its
// response — including one rendered by the app's error handler from a
// returned error — is recorded before it goes out. Replays and rejections
// are written with fiber's own API and the rest of the chain does not run.
//
// A handler error is rendered by the app's error handler inside the
// middleware (so that what is stored is what the client saw) and is not
// returned up the chain: middleware registered before idem sees a nil error
// and the rendered response.
//
// It fails without a scope (WithScope, or core.WithScope on the engine)
// unless the engine opted into core.WithSharedKeySpace, and with a nil
// engine.
func New(eng *core.Engine, opts ...Option) (fiber.Handler, error) {
	if eng == nil {
		return nil, errors.New("fiberidem: engine is nil")
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := eng.CheckScope("fiberidem.WithScope", cfg.scope != nil); err != nil {
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

// defaultRoute returns the route template, or "" when fiber does not say
// which route will serve the request: the path then stands in for it
// (core.Request.Route).
func defaultRoute(c *fiber.Ctx) string {
	r := c.Route()
	// A route registered with app.Use or Group.Use matches a prefix of the
	// path ("/" or "/v1" for "/v1/payments"): it is the middleware's route,
	// not the handler's, and fiber does not say which one it is. A template
	// with as many segments as the path matched it whole and is the
	// handler's; one with fewer is a Use prefix, and so is fiber's stand-in
	// route without handlers. Wildcard templates ("/files/*") are trusted.
	if r == nil || len(r.Handlers) == 0 {
		return ""
	}
	if segments(r.Path) == segments(c.Path()) || strings.ContainsAny(r.Path, "*+") {
		return r.Path // owned by the app, stable
	}
	return ""
}

// useField is the index of fiber.Route's unexported "use" flag (a route
// registered with app.Use, Group.Use or app.Mount: a path prefix, not a
// route), which fiber exposes no other way (GetRoutes(true) copies every
// route). nil if a fiber release renames it: every route then counts as a
// route, as before issue 19 (requests are protected, never let through).
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

// routed reports whether a route (not a Use prefix) of c's app matches the
// request's method and path, as fiber's router will find it: fiber runs a
// middleware registered with app.Use before routing, and answers 404 or
// 405 only once the chain finds no route. fiber.RoutePatternMatch is the
// router's own matching; the path is prepared as fiber prepares it
// (trailing slashes dropped unless StrictRouting). Asked only for requests
// idem protects: it walks the method's routes.
func routed(c *fiber.Ctx) bool {
	app := c.App()
	cfg := app.Config()
	methods := cfg.RequestMethods
	if len(methods) == 0 {
		methods = fiber.DefaultMethods
	}
	stack := app.Stack()
	path := c.Path()
	if !cfg.StrictRouting && len(path) > 1 {
		if path = strings.TrimRight(path, "/"); path == "" {
			path = "/"
		}
	}
	for i, m := range methods {
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

func segments(p string) int {
	p = strings.Trim(p, "/")
	if p == "" {
		return 0
	}
	return strings.Count(p, "/") + 1
}

func (m *middleware) handle(c *fiber.Ctx) error {
	if m.cfg.skip != nil && m.cfg.skip(c) {
		return c.Next()
	}
	var route string
	if m.cfg.route != nil {
		route = strings.Clone(m.cfg.route(c)) // it may alias fasthttp's buffers
	} else {
		route = defaultRoute(c)
	}
	req := core.Request{
		Method: methodOf(c),
		Route:  route,
		// Hashed inside Decide, never kept: no copy needed beyond string().
		Target: string(c.Request().RequestURI()),
		// Read on demand: only the headers the engine needs are copied.
		HeaderReader: (*requestHeaders)(&c.Request().Header),
	}
	if r := c.Route(); r == nil || isUse(r) || len(r.Handlers) == 0 {
		// Registered with app.Use or Group.Use: fiber runs it before
		// routing, for paths no route serves too.
		req.NoRoute = func() bool { return !routed(c) }
	}
	var stream *streamBody
	if c.Request().IsBodyStream() {
		// fiber.Config.StreamRequestBody: read by the engine up to its
		// limit, and given back to the handler (Next).
		stream = &streamBody{r: c.Request().BodyStream()}
		req.Body = stream
	} else {
		// The body as received, never c.Body(), which inflates a gzip,
		// deflate or brotli body without bound: every adapter fingerprints
		// the bytes on the wire, and the engine asks for them only for a
		// request it protects, once the method, key and scope checks pass.
		// Hashed in place: Decide keeps no reference, and the handler reads
		// the body from fiber as usual (c.Body() decoding it then).
		req.Body = adapterkit.BodyBytes(c.Request().Body)
	}
	if m.cfg.scope != nil {
		scope := m.cfg.scope
		req.ScopeFunc = func(context.Context, *core.Request) (string, error) {
			s, err := scope(c)
			return strings.Clone(s), err
		}
	}
	x := &exchange{m: m, c: c}
	err := m.eng.Serve(c.UserContext(), req, x)
	if stream != nil && stream.started && !stream.done {
		// Refused part-way (over the limit, unreadable): the rest of the
		// body is still on the connection, which cannot carry another
		// request.
		c.Context().SetConnectionClose()
	}
	if x.saved != nil {
		headerPool.Put(x.saved)
	}
	return err
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
	c     *fiber.Ctx
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
			if catch := c.App().ErrorHandler(c, err); catch != nil {
				_ = c.SendStatus(fiber.StatusInternalServerError)
			}
		}
		return err
	}
	if d == nil {
		return c.Next()
	}
	parent := c.UserContext()
	c.SetUserContext(ctx)
	// The lease context ends with the execution; outer middleware gets its
	// own context back.
	defer c.SetUserContext(parent)
	// What earlier middleware put in the response (CORS, request ID) before
	// calling us, so that a problem written instead of the handler's
	// response keeps it but drops the handler's headers and cookies.
	x.saved = snapshotHeader(&c.Response().Header)
	herr := c.Next()
	if herr != nil {
		// Render the error now, exactly as fiber would after the chain
		// returns, so that the recorded response is the one the client gets.
		if catch := c.App().ErrorHandler(c, herr); catch != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError)
		}
	}
	return herr
}

func (x *exchange) Captured() adapterkit.Response { return x.m.capture(x.c, x.maxResponse, x.saved) }

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
		x.c.Context().Hijack(nil)
		x.c.Context().HijackSetNoResponse(false)
	}
	return true
}

func (x *exchange) Write(resp *adapterkit.Response) error { return writeResponse(x.c, resp) }

func (x *exchange) OnError(err error, fallback *adapterkit.Response) (bool, error) {
	if x.m.cfg.onError == nil {
		return false, nil
	}
	r := x.c.Response()
	rerr := x.m.cfg.onError(x.c, err, fallback)
	return rerr != nil || r.StatusCode() != fiber.StatusOK || len(r.Body()) > 0 || r.IsBodyStream(), rerr
}

// capture reads the response the handler left in c.Response(). Everything
// the engine gets from it is copied (the body here, header values by
// responseHeaders): fasthttp reuses the buffers for the next request.
func (m *middleware) capture(c *fiber.Ctx, maxResponse int, saved *fasthttp.ResponseHeader) adapterkit.Response {
	r := c.Response()
	resp := adapterkit.Response{Status: r.StatusCode()}
	// A body stream (c.SendStream, SetBodyStreamWriter, c.SendFile of a
	// large file) is produced while the response is written, after we
	// return; a hijacked connection is the handler's. Neither can be kept.
	if r.IsBodyStream() || c.Context().Hijacked() {
		resp.Streamed = true
		return resp
	}
	body := r.Body()
	if len(body) > maxResponse {
		resp.Truncated = true
		return resp
	}
	if len(body) == 0 {
		if untouched(saved, &r.Header) {
			resp.Status = 0 // answered nothing (see untouched)
		}
		resp.Header = responseHeader(&r.Header)
		dropImplicitContentType(c, resp.Header)
		resp.Body = []byte{}
		return resp
	}
	resp.HeaderReader = (*responseHeaders)(&r.Header)
	resp.Body = bytes.Clone(body)
	return resp
}

// dropImplicitContentType removes fasthttp's default Content-Type from the
// captured headers of an empty response: fasthttp reports it (All,
// ContentType) but does not send it with an empty body unless the handler
// set it, and a replay must not gain a header the client never saw.
func dropImplicitContentType(c *fiber.Ctx, h http.Header) {
	rh := &c.Response().Header
	if ct := rh.ContentType(); len(ct) == 0 || string(ct) != defaultContentType {
		return // none, or one the handler set
	}
	rh.SetNoDefaultContentType(true)
	explicit := len(rh.ContentType()) > 0
	if explicit {
		rh.SetNoDefaultContentType(c.App().Config().DisableDefaultContentType)
		return
	}
	rh.SetNoDefaultContentType(false) // the default showed, so it was false
	delete(h, fiber.HeaderContentType)
}

// defaultContentType is fasthttp's default response Content-Type.
const defaultContentType = "text/plain; charset=utf-8"

// writeResponse writes resp with fiber's API: its headers (replacing any of
// the same name), status and body. The body is copied into fasthttp's own
// (pooled) buffer: a replay's body is the store's, and later middleware
// may edit c.Response().Body() in place.
func writeResponse(c *fiber.Ctx, resp *adapterkit.Response) error {
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

// methodOf returns the request method without aliasing fasthttp's buffer.
func methodOf(c *fiber.Ctx) string {
	switch m := c.Method(); m {
	case fiber.MethodPost:
		return fiber.MethodPost
	case fiber.MethodPatch:
		return fiber.MethodPatch
	case fiber.MethodPut:
		return fiber.MethodPut
	case fiber.MethodDelete:
		return fiber.MethodDelete
	case fiber.MethodGet:
		return fiber.MethodGet
	case fiber.MethodHead:
		return fiber.MethodHead
	case fiber.MethodOptions:
		return fiber.MethodOptions
	default:
		return strings.Clone(m)
	}
}
