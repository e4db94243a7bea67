package ginidem

import (
	"context"
	"errors"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
)

// noRoute is core.Request.NoRoute for a request no route matched.
func noRoute() bool { return true }

// New returns gin middleware that runs the rest of the chain at most once
// per (scope, key):
//
//	idem, err := ginidem.New(eng, ginidem.WithScope(userID))
//	r.POST("/v1/payments", idem, createPayment)
//
// It may also be registered with r.Use or Group.Use: a request no route
// matches (c.FullPath() is "") then passes through to gin's own 404 or 405
// untouched, with no key required and nothing recorded.
//
// The route template (c.FullPath()) is part of the request fingerprint, in
// canonical form (adapterkit.CanonicalRoute). A
// replay or a rejection is written with gin's writer and the chain is
// aborted (c.Abort).
//
// It fails without a scope (WithScope, or core.WithScope on the engine)
// unless the engine opted into core.WithSharedKeySpace, and with a nil
// engine.
func New(eng *core.Engine, opts ...Option) (gin.HandlerFunc, error) {
	if eng == nil {
		return nil, errors.New("ginidem: engine is nil")
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := eng.CheckScope("ginidem.WithScope", cfg.scope != nil); err != nil {
		return nil, err
	}
	return func(c *gin.Context) {
		if cfg.skip != nil && cfg.skip(c) {
			return
		}
		// FullPath is "" when no route matched: idem mounted with r.Use
		// runs in gin's 404/405 chain too, which must stay gin's.
		route := c.FullPath()
		req := core.Request{Method: c.Request.Method, Route: route, Target: c.Request.URL.RequestURI(), Header: c.Request.Header, Body: c.Request.Body}
		if route == "" {
			req.NoRoute = noRoute
		}
		if cfg.scope != nil {
			scope := cfg.scope
			req.ScopeFunc = func(context.Context, *core.Request) (string, error) { return scope(c) }
		}
		_ = eng.Serve(c.Request.Context(), req, &exchange{c: c, onError: cfg.onError})
	}, nil
}

// exchange translates one request for core.Engine.Serve.
type exchange struct {
	c       *gin.Context
	onError ErrorHandler
	// Proceed only:
	orig    gin.ResponseWriter
	rec     *adapterkit.Recorder
	w       *writer
	behind  bool // something wrote to gin's writer behind the capture
	errOnly bool // the chain only called c.Error: no response
	d       *adapterkit.Proceed
}

func (x *exchange) Next(ctx context.Context, d *adapterkit.Proceed) error {
	if d == nil {
		return nil // Bypass: the chain goes on untouched after us
	}
	x.d = d
	c := x.c
	r := c.Request
	d.RestoreBody(r)
	x.orig = c.Writer
	x.rec = adapterkit.NewRecorder(x.orig, d.MaxResponseBytes)
	x.w = newWriter(x.orig, x.rec)
	errs := len(c.Errors)
	c.Writer = x.w
	c.Request = r.WithContext(ctx)
	defer func() {
		// Outer middleware sees gin's own writer and the request it passed
		// in, whose context is not the finished lease's.
		c.Writer = x.orig
		c.Request = r
	}()
	c.Next()

	// Something wrote to gin's writer behind the capture (a handler kept
	// the original c.Writer, or re-routed with engine.HandleContext, which
	// resets c.Writer): that response went out uncaptured.
	x.behind = x.orig.Written() && !x.rec.Streaming()
	if !x.w.Written() {
		switch {
		case x.w.statusSet:
			// gin commits the status of a chain that set one but wrote no
			// body after the chain (c.Status(204)); do it now, into the capture.
			x.w.WriteHeaderNow()
		case len(c.Errors) > errs:
			// Only c.Error, no response: the handler failed.
		}
	}
	if len(c.Errors) > errs {
		x.errOnly = !x.w.Written()
		return c.Errors.Last()
	}
	return nil
}

// Panicked puts the panic (its value scrubbed of the key by core) in
// c.Errors (private: for logging middleware, never rendered by gin). It
// masks the key header of the request: when the response was already out,
// the panic goes on up (http.ErrAbortHandler), and gin's Recovery prints
// the request's headers.
func (x *exchange) Panicked(cause error) {
	_ = x.c.Error(cause)
	if h := x.d.KeyHeader; h != "" && len(x.c.Request.Header[h]) > 0 {
		x.c.Request.Header[h] = []string{core.RedactKey(x.d.Key)}
	}
}

// Cut closes the connection before Serve panics with http.ErrAbortHandler
// to end the response broken (adapterkit.Cutter): gin's Recovery takes that
// panic for a broken pipe and swallows it, and net/http would then end the
// response cleanly, as if complete. HTTP/1 only: an HTTP/2 stream is reset
// only by the panic reaching net/http.
func (x *exchange) Cut() {
	if x.orig == nil {
		return
	}
	// Through gin's writer first, so that gin writes no header after it;
	// that writer refuses once body bytes went out: then the one under it.
	conn, _, err := http.NewResponseController(x.orig).Hijack()
	if u, ok := x.orig.(interface{ Unwrap() http.ResponseWriter }); err != nil && ok {
		conn, _, err = http.NewResponseController(u.Unwrap()).Hijack()
	}
	if err == nil {
		_ = conn.Close()
	}
}

func (x *exchange) Captured() adapterkit.Response {
	res := x.rec.Result()
	if x.behind {
		// Recorded as not retained rather than store a response nobody saw.
		res.Status, res.Streamed = x.orig.Status(), true
	}
	return res
}

func (x *exchange) Send() error {
	if x.behind {
		return nil
	}
	err := x.rec.Send()
	x.orig.WriteHeaderNow()
	return err
}

func (x *exchange) Discard() bool {
	if x.rec == nil {
		return true
	}
	x.c.Abort() // nothing after a failed handler may run
	return !x.behind && !x.rec.Streaming() && !x.orig.Written()
}

// Write writes resp with gin's writer, commits the header (nothing gin or
// outer middleware writes later can change it) and aborts the chain.
//
// After a chain that only called c.Error, rendering the error is gin's
// error middleware's job, outside this one: the status (500) is set but
// not committed, so that middleware answers, and a chain without one
// answers 500, never an empty 200.
func (x *exchange) Write(resp *adapterkit.Response) error {
	if x.errOnly {
		x.errOnly = false
		x.c.Status(resp.Status)
		x.c.Abort()
		return nil
	}
	err := adapterkit.WriteResponse(x.c.Writer, resp)
	x.c.Writer.WriteHeaderNow()
	x.c.Abort()
	return err
}

func (x *exchange) OnError(err error, fallback *adapterkit.Response) (bool, error) {
	c := x.c
	c.Abort()
	if x.onError == nil {
		return false, nil
	}
	x.onError(c, err, fallback)
	switch {
	case c.Writer.Written():
		return true, nil
	case c.Writer.Status() != http.StatusOK:
		c.Writer.WriteHeaderNow() // a status without a body
		return true, nil
	}
	return false, nil
}
