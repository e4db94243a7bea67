package fiberidem

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/idemkit/idem/core"
)

// New returns a fiber handler that runs the rest of the chain at most once
// per (scope, key). Mount it on the routes it protects, so that c.Route()
// is the handler's route:
//
//	app.Post("/v1/payments", fiberidem.New(eng, opts...), createPayment)
//
// It may also be registered with app.Use or Group.Use; see WithRoute for
// how the route is then found.
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
func New(eng *core.Engine, opts ...Option) fiber.Handler {
	cfg := config{onError: defaultErrorHandler}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if eng == nil {
		return func(*fiber.Ctx) error {
			return fiber.NewError(fiber.StatusInternalServerError, "fiberidem: middleware built without an engine")
		}
	}
	m := &middleware{eng: eng, cfg: cfg, maxResponse: eng.MaxResponseBytes()}
	return m.handle
}

type middleware struct {
	eng         *core.Engine
	cfg         config
	maxResponse int
}

func defaultRoute(c *fiber.Ctx) string {
	r := c.Route()
	path := c.Path()
	// A route registered with app.Use or Group.Use matches a prefix of the
	// path ("/" or "/v1" for "/v1/payments"): it is the middleware's route,
	// not the handler's, and fiber does not say which one it is. A template
	// with as many segments as the path matched it whole and is the
	// handler's; one with fewer is a Use prefix, and so is fiber's stand-in
	// route without handlers. Wildcard templates ("/files/*") are trusted.
	// The fallback is the request path, copied: c.Path() aliases the request
	// buffer.
	if r == nil || len(r.Handlers) == 0 {
		return strings.Clone(path)
	}
	if segments(r.Path) == segments(path) || strings.ContainsAny(r.Path, "*+") {
		return r.Path // owned by the app, stable
	}
	return strings.Clone(path)
}

func segments(p string) int {
	p = strings.Trim(p, "/")
	if p == "" {
		return 0
	}
	return strings.Count(p, "/") + 1
}

func defaultErrorHandler(c *fiber.Ctx, _ error, fallback *core.Response) error {
	return writeResponse(c, fallback)
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
	// Hashed in place: Decide keeps no reference to BodyBytes, and the
	// handler reads the body from fiber as usual.
	req.BodyBytes = c.Body()
	if req.BodyBytes == nil {
		req.BodyBytes = []byte{} // nil would mean "read Body"
	}
	if m.cfg.scope != nil {
		scope := m.cfg.scope
		req.ScopeFunc = func(context.Context) (string, error) {
			s, err := scope(c)
			return strings.Clone(s), err
		}
	}
	parent := c.UserContext()
	d, err := m.eng.Decide(parent, req)
	if err != nil {
		var fallback *core.Response
		if d != nil {
			fallback = d.Response
		}
		return m.cfg.onError(c, err, fallback)
	}
	switch d.Outcome {
	case core.Bypass:
		return c.Next()
	case core.Replay, core.Reject:
		return writeResponse(c, d.Response)
	}
	return m.proceed(c, d, parent)
}

func (m *middleware) proceed(c *fiber.Ctx, d *core.Decision, parent context.Context) (err error) {
	ctx := d.Context(parent)
	c.SetUserContext(ctx)
	// What earlier middleware put in the response (CORS, request ID) before
	// calling us, so that a problem written instead of the handler's
	// response keeps it but drops the handler's headers and cookies.
	saved := snapshotHeader(&c.Response().Header)
	completed := false
	defer func() {
		// The lease context ends with the execution; outer middleware gets
		// its own context back.
		c.SetUserContext(parent)
		if !completed {
			p := recover()
			_ = m.eng.Abort(ctx, d, fmt.Errorf("fiberidem: handler panicked: %v\n%s", p, debug.Stack()))
			replaceResponse(c, saved, m.eng.PanicResponse())
			err = nil
		}
		headerPool.Put(saved)
	}()

	if herr := c.Next(); herr != nil {
		// Render the error now, exactly as fiber would after the chain
		// returns, so that the recorded response is the one the client gets.
		if catch := c.App().ErrorHandler(c, herr); catch != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError)
		}
	}
	completed = true

	if cerr := m.eng.Commit(ctx, d, m.capture(c)); cerr != nil {
		restoreHeader(c, saved)
		return m.cfg.onError(c, cerr, m.eng.CommitErrorResponse(cerr))
	}
	return nil
}

// capture reads the response the handler left in c.Response(). Everything
// the engine gets from it is copied (the body here, header values by
// responseHeaders): fasthttp reuses the buffers for the next request.
func (m *middleware) capture(c *fiber.Ctx) core.Response {
	r := c.Response()
	resp := core.Response{Status: r.StatusCode()}
	// A body stream (c.SendStream, SetBodyStreamWriter, c.SendFile of a
	// large file) is produced while the response is written, after we
	// return; a hijacked connection is the handler's. Neither can be kept.
	if r.IsBodyStream() || c.Context().Hijacked() {
		resp.Streamed = true
		return resp
	}
	body := r.Body()
	if len(body) > m.maxResponse {
		resp.Truncated = true
		return resp
	}
	if len(body) == 0 {
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
// captured headers of an empty response: fasthttp reports it (VisitAll,
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
func writeResponse(c *fiber.Ctx, resp *core.Response) error {
	if resp == nil {
		resp = core.ProblemResponse(core.ProblemBaseURI, core.ProblemStoreUnavailable, http.StatusServiceUnavailable,
			"the idempotency store could not be reached; the request was not processed")
	}
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

func snapshotHeader(h *fasthttp.ResponseHeader) *fasthttp.ResponseHeader {
	s, _ := headerPool.Get().(*fasthttp.ResponseHeader)
	if s == nil {
		s = new(fasthttp.ResponseHeader)
	}
	h.CopyTo(s)
	return s
}

// restoreHeader drops the handler's response (headers, cookies, status,
// body or body stream) and puts back the headers earlier middleware set.
func restoreHeader(c *fiber.Ctx, saved *fasthttp.ResponseHeader) {
	r := c.Response()
	r.ResetBody()
	saved.CopyTo(&r.Header)
}

func replaceResponse(c *fiber.Ctx, saved *fasthttp.ResponseHeader, resp *core.Response) {
	restoreHeader(c, saved)
	_ = writeResponse(c, resp)
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
