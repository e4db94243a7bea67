package ginidem

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
)

// gin's answers for unmatched routes (gin.go default404Body/default405Body),
// which gin writes after the chain unless the chain wrote something.
var (
	notFoundBody         = []byte("404 page not found")
	methodNotAllowedBody = []byte("405 method not allowed")
)

// Middleware returns gin middleware that runs the rest of the chain at most
// once per (scope, key):
//
//	r.POST("/v1/payments", ginidem.Middleware(eng), createPayment)
//
// The route template (c.FullPath(), or the path for unmatched routes) is part
// of the request fingerprint. A replay or a rejection is written with gin's
// writer and the chain is aborted (c.Abort). A nil engine answers 500.
func Middleware(eng *core.Engine, opts ...Option) gin.HandlerFunc {
	cfg := config{onError: defaultErrorHandler}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.onError == nil {
		cfg.onError = defaultErrorHandler
	}
	return func(c *gin.Context) {
		if eng == nil {
			c.Data(http.StatusInternalServerError, "text/plain; charset=utf-8",
				[]byte("idem: middleware built without an engine"))
			c.Abort()
			return
		}
		if cfg.skip != nil && cfg.skip(c) {
			return
		}
		route := c.FullPath()
		if route == "" {
			route = c.Request.URL.Path
		}
		req := core.Request{Method: c.Request.Method, Route: route, Target: c.Request.URL.RequestURI(), Header: c.Request.Header, Body: c.Request.Body}
		if cfg.scope != nil {
			scope := cfg.scope
			req.ScopeFunc = func(context.Context) (string, error) { return scope(c) }
		}
		serve(eng, &cfg, c, req)
	}
}

func serve(eng *core.Engine, cfg *config, c *gin.Context, req core.Request) {
	d, err := eng.Decide(c.Request.Context(), req)
	if err != nil {
		var fallback *core.Response
		if d != nil {
			fallback = d.Response
		}
		handleError(c, cfg, err, fallback)
		return
	}
	r := c.Request
	if d.BodyRead {
		body := d.Body
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	switch d.Outcome {
	case core.Bypass:
		return // the chain goes on untouched
	case core.Replay, core.Reject:
		writeResponse(c, d.Response)
		c.Abort()
		return
	}

	orig := c.Writer
	rec := core.NewRecorder(orig, eng.MaxResponseBytes())
	// Headers outer middleware already set (Vary: Origin, X-Request-Id) stay
	// visible to the chain, and what it adds to them is added, as without
	// idem; the recorder's copy replaces them only with its response.
	for k, v := range orig.Header() {
		rec.Header()[k] = append([]string(nil), v...)
	}
	w := newWriter(orig, rec)
	ctx := d.Context(r.Context())
	errs := len(c.Errors)
	c.Writer = w
	c.Request = r.WithContext(ctx)
	completed := false
	defer func() {
		// Outer middleware sees gin's own writer (with the status sent) and
		// the request it passed in, whose context is not the finished lease's.
		c.Writer = orig
		c.Request = r
		if completed {
			return
		}
		p := recover()
		cause := fmt.Errorf("ginidem: handler panicked: %v\n%s", p, debug.Stack())
		_ = eng.Abort(ctx, d, cause)
		// The rest of the chain must not run after the panicking handler.
		c.Abort()
		if p == http.ErrAbortHandler || rec.Streaming() || orig.Written() { //nolint:errorlint // sentinel compared as net/http does
			// The response is half out; let net/http drop the connection.
			panic(http.ErrAbortHandler)
		}
		_ = c.Error(cause) // private: for logging middleware, never rendered by gin
		if sent, _ := rec.SendInstead(eng.PanicResponse()); sent {
			orig.WriteHeaderNow()
		}
	}()
	c.Next()
	completed = true

	if orig.Written() && !rec.Streaming() {
		// Something wrote to gin's writer behind the capture (a handler
		// kept the original c.Writer, or re-routed with engine.HandleContext,
		// which resets c.Writer): that response went out uncaptured. Record
		// it as not retained rather than store a response nobody saw.
		res := rec.Result()
		res.Status, res.Streamed = orig.Status(), true
		_ = eng.Commit(ctx, d, res)
		return
	}
	if !w.Written() {
		switch {
		case w.statusSet:
			// gin commits the status of a chain that set one but wrote no
			// body after the chain (c.Status(204)); do it now, into the recorder.
			w.WriteHeaderNow()
		case len(c.Errors) > errs:
			// Only c.Error, no response: a failed execution. Release the key
			// and leave the answer to the error middleware outside this one.
			_ = eng.Abort(ctx, d, fmt.Errorf("ginidem: handler error: %w", c.Errors.Last()))
			return
		case c.FullPath() == "" && w.status == http.StatusNotFound:
			w.Header()["Content-Type"] = []string{gin.MIMEPlain}
			_, _ = w.Write(notFoundBody)
		case c.FullPath() == "" && w.status == http.StatusMethodNotAllowed:
			w.Header()["Content-Type"] = []string{gin.MIMEPlain}
			_, _ = w.Write(methodNotAllowedBody)
		}
	}

	if err := eng.Commit(ctx, d, rec.Result()); err != nil {
		if !rec.Streaming() {
			// The handler's response is still buffered in rec and never goes
			// out: answer on gin's writer instead.
			c.Writer = orig
			handleError(c, cfg, err, eng.CommitErrorResponse(err))
		}
		return
	}
	_ = rec.Send()
	orig.WriteHeaderNow()
}

// handleError runs the error handler and aborts the chain. An error handler
// that leaves the response unwritten with gin's default status would let gin
// answer an empty 200 to a request that did not complete: fallback is
// written instead.
func handleError(c *gin.Context, cfg *config, err error, fallback *core.Response) {
	cfg.onError(c, err, fallback)
	c.Abort()
	if c.Writer.Written() {
		return
	}
	if c.Writer.Status() == http.StatusOK && fallback != nil {
		writeResponse(c, fallback)
		return
	}
	c.Writer.WriteHeaderNow()
}

// writeResponse writes resp with gin's writer and commits the header, so
// nothing gin or outer middleware writes later can change it.
func writeResponse(c *gin.Context, resp *core.Response) {
	_ = core.WriteResponse(c.Writer, resp)
	c.Writer.WriteHeaderNow()
}
