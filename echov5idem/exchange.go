package echov5idem

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/idemkit/idem/core"
)

// exchange translates one request for core.Engine.Serve.
type exchange struct {
	c       *echo.Context
	next    echo.HandlerFunc
	onError ErrorHandler
	rec     *core.Recorder // Proceed only
}

// response is the *echo.Response under c.Response() (outer middleware may
// have wrapped it), or nil when a middleware installed a writer that does
// not unwrap to one.
func (x *exchange) response() *echo.Response {
	res, err := echo.UnwrapResponse(x.c.Response())
	if err != nil {
		return nil
	}
	return res
}

func (x *exchange) Next(ctx context.Context, d *core.Decision) error {
	c := x.c
	if d == nil {
		return x.next(c)
	}
	r := c.Request()
	d.RestoreBody(r)
	if res := x.response(); res != nil {
		// Capture under echo.Response, which keeps tracking Status, Size
		// and Committed, so the error handler does not render over a
		// response the handler wrote.
		orig := res.ResponseWriter
		x.rec = core.NewRecorder(orig, d.MaxResponseBytes())
		res.ResponseWriter = x.rec
		defer func() { res.ResponseWriter = orig }()
	} else {
		w := c.Response()
		x.rec = core.NewRecorder(w, d.MaxResponseBytes())
		c.SetResponse(x.rec)
		defer c.SetResponse(w)
	}
	c.SetRequest(r.WithContext(ctx))
	// Outer middleware gets the request whose context is not the (soon
	// cancelled) lease context.
	defer c.SetRequest(r)
	herr := x.next(c)
	if herr != nil {
		// Render the error now, into the capture: what is stored is what
		// the client sees. Echo must not render it again: Serve returns nil.
		renderError(c, herr)
	}
	return herr
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

func (x *exchange) Captured() core.Response { return x.rec.Result() }

func (x *exchange) Send() error {
	res := x.response()
	if x.rec.Streaming() {
		// Already out (flushed, hijacked or too large); echo.Response saw
		// the writes, except a flush before any of them.
		if res != nil && !res.Committed {
			sent(res, x.rec.Status(), int(res.Size))
		}
		return nil
	}
	result := x.rec.Result()
	err := x.rec.Send()
	if res != nil {
		sent(res, result.Status, len(result.Body))
	}
	return err
}

// Discard makes echo's writer pristine again: the handler's writes went
// into the capture, which is dropped.
func (x *exchange) Discard() bool {
	if x.rec != nil && x.rec.Streaming() {
		return false
	}
	if res := x.response(); res != nil {
		res.Committed = false
		res.Status = http.StatusOK
		res.Size = 0
	}
	return true
}

func (x *exchange) Write(resp *core.Response) error {
	return core.WriteResponse(x.c.Response(), resp)
}

func (x *exchange) OnError(err error, fallback *core.Response) (bool, error) {
	if x.onError == nil {
		return false, nil
	}
	rerr := x.onError(x.c, err, fallback)
	res := x.response()
	return rerr != nil || res != nil && res.Committed, rerr
}

// sent makes echo.Response describe a response written past it (straight
// to its underlying writer), so that outer middleware and the error
// handler see it as committed with the right status and size.
func sent(res *echo.Response, status, size int) {
	if status == 0 {
		status = http.StatusOK
	}
	res.Status = status
	res.Size = int64(size)
	res.Committed = true
}
