package echov5idem

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core/adapterkit"
)

// exchange translates one request for core.Engine.Serve.
type exchange struct {
	c       *echo.Context
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
	// The capture sits right under the handler, above whatever outer
	// middleware installed as c.Response() (Gzip finishes its stream only
	// after the chain returns, so below it the capture would hold a cut
	// stream): what is stored is what the handler wrote, and replays go
	// out through the outer writers like any response. The handler sees a
	// fresh *echo.Response over the capture, so Committed, Status and Size
	// describe its own writes and the error handler does not render over
	// a response it wrote.
	orig := c.Response()
	x.rec = adapterkit.NewRecorder(orig, d.MaxResponseBytes)
	c.SetResponse(echo.NewResponse(x.rec, logger(c)))
	c.SetRequest(r.WithContext(ctx))
	defer func() {
		// Outer middleware gets its writer back, and the request whose
		// context is not the (soon cancelled) lease context.
		c.SetResponse(orig)
		c.SetRequest(r)
	}()
	herr := x.next(c)
	if herr != nil {
		// Render the error now, into the capture: what is stored is what
		// the client sees. Echo must not render it again: Serve returns nil.
		renderError(c, herr)
	}
	return herr
}

// logger is what echo.Response logs a superfluous WriteHeader to.
func logger(c *echo.Context) *slog.Logger {
	if c.Echo() == nil {
		return slog.Default() // a context made without an Echo
	}
	return c.Logger()
}

// renderError renders err as Echo would after the handler chain: with the
// app's HTTPErrorHandler, or echo's default for a context made without an
// Echo.
func renderError(c *echo.Context, err error) {
	if e := c.Echo(); e != nil && e.HTTPErrorHandler != nil {
		e.HTTPErrorHandler(c, err)
		return
	}
	echo.DefaultHTTPErrorHandler(false)(c, err)
}

func (x *exchange) Captured() adapterkit.Response { return x.rec.Result() }

// Send writes the captured response out through c.Response(), which
// tracks it as for any response; one that streamed is already out.
func (x *exchange) Send() error { return x.rec.Send() }

// Discard reports whether nothing of the handler's response went out: it
// was only captured, and the capture is dropped.
func (x *exchange) Discard() bool { return x.rec == nil || !x.rec.Streaming() }

func (x *exchange) Write(resp *adapterkit.Response) error {
	if x.rec != nil {
		_, err := x.rec.SendInstead(resp)
		return err
	}
	return adapterkit.WriteResponse(x.c.Response(), resp)
}

func (x *exchange) OnError(err error, fallback *adapterkit.Response) (bool, error) {
	if x.onError == nil {
		return false, nil
	}
	orig := x.c.Response()
	tw := &trackingWriter{ResponseWriter: orig}
	x.c.SetResponse(tw)
	rerr := x.onError(x.c, err, fallback)
	x.c.SetResponse(orig)
	return rerr != nil || tw.wrote, rerr
}

// trackingWriter tells whether an error handler wrote anything (a writer
// such as Gzip's may hold the status back, so echo.Response cannot tell).
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

// Unwrap returns the wrapped writer (echo.UnwrapResponse,
// http.ResponseController).
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }
