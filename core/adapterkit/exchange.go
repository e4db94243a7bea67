package adapterkit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
)

// Exchange is one request as an adapter presents it to core.Engine.Serve: the
// framework's request is already translated into a Request; these methods
// translate the rest (running the chain, capturing and writing responses,
// the user's error handler). An Exchange holds no flow: Serve decides what
// happens and in which order.
type Exchange interface {
	// Next runs the rest of the chain. With d nil (Bypass) it runs as if
	// idem were absent. With d set (the request owns its key) it runs on ctx, which
	// carries the lease, with the request body restored from d (see
	// Proceed.RestoreBody), and captures the response: nothing reaches
	// the client until Send. An error the chain returns (gin's c.Error,
	// echo's and fiber's returned error) is rendered into the capture the
	// framework's usual way, when the framework renders errors, and
	// returned.
	Next(ctx context.Context, d *Proceed) error
	// Captured returns the response as captured: Status 0 and no body when
	// the handler wrote nothing.
	Captured() Response
	// Send writes the captured response to the client.
	Send() error
	// Discard drops the captured response (the handler's status, headers
	// and body; headers outer middleware set before idem stay). It reports
	// false when the response already went out (flushed, hijacked, over
	// the response limit) and can no longer be replaced.
	Discard() bool
	// Write writes resp (a replay, a problem) to the client and ends the
	// chain: nothing after idem answers in its place.
	Write(resp *Response) error
	// OnError hands a failure to the user's error handler, if one is set,
	// with fallback, the response idem would write. answered reports
	// whether the handler answered: wrote a response, set a status, or
	// returned an error (err) for the framework to render. An error
	// handler that stays silent gets fallback written for it: a request
	// that did not complete never looks like a success.
	OnError(err error, fallback *Response) (answered bool, rerr error)
}

// Cutter is an optional Exchange method: Serve calls Cut just before it
// panics with http.ErrAbortHandler to end a response that must not look
// complete (part of it went out, then the handler panicked or its outcome
// could not be recorded; or the handler panicked with
// http.ErrAbortHandler). An adapter whose framework may swallow that panic
// and end the response cleanly (gin's Recovery takes it for a broken pipe)
// cuts the connection in Cut; net/http drops it on the panic.
type Cutter interface {
	Cut()
}

// PanicReporter is an optional Exchange method: Serve calls Panicked with
// the cause (the panic value and stack) after releasing the key, before
// answering, so that the framework's own error reporting sees it (ginidem
// adds it to c.Errors for logging middleware).
type PanicReporter interface {
	Panicked(cause error)
}

// Proceed is what Exchange.Next receives for a request that owns its key
// (the engine's Proceed outcome): the request body as the engine read it,
// and what the adapter needs to capture the handler's response. The engine
// fills it; adapters only read it.
type Proceed struct {
	// Key is the request's idempotency key, decoded.
	Key string
	// KeyHeader is the engine's key header (canonical form), for an
	// adapter that masks the key from what runs after it.
	KeyHeader string
	// Body is the request body as the engine read it; BodyRead tells
	// whether it read Request.Body at all (it does not when the adapter
	// handed the body over as BodyBytes).
	Body     []byte
	BodyRead bool
	// MaxResponseBytes is the engine's response limit
	// (core.WithMaxResponseBytes), for sizing the capture (NewRecorder).
	MaxResponseBytes int
}

// RestoreBody gives r back the body the engine read (when it read one), so the
// handler reads it as if idem were absent.
func (d *Proceed) RestoreBody(r *http.Request) {
	if d == nil || !d.BodyRead || r == nil {
		return
	}
	body := d.Body
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// BodyBytes is a request body the framework already holds in memory
// (fasthttp): set as core.Request.Body, it is hashed in place, without a
// copy, and called only for a request the engine protects. The engine
// keeps no reference to the bytes once Decide returns, so they may alias
// the framework's buffer. It is an io.Reader only to fit Request.Body: the
// engine calls the function, and Read always fails.
type BodyBytes func() []byte

// Read fails: a BodyBytes is called, not read.
func (BodyBytes) Read([]byte) (int, error) {
	return 0, errors.New("adapterkit: a BodyBytes body is called for its bytes, not read")
}
