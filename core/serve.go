package core

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
)

// Exchange is one request as an adapter presents it to Engine.Serve: the
// framework's request is already translated into a Request; these methods
// translate the rest (running the chain, capturing and writing responses,
// the user's error handler). An Exchange holds no flow: Serve decides what
// happens and in which order.
type Exchange interface {
	// Next runs the rest of the chain. With d nil (Bypass) it runs as if
	// idem were absent. With a Proceed decision it runs on ctx, which
	// carries the lease, with the request body restored from d (see
	// Decision.RestoreBody), and captures the response: nothing reaches
	// the client until Send. An error the chain returns (gin's c.Error,
	// echo's and fiber's returned error) is rendered into the capture the
	// framework's usual way, when the framework renders errors, and
	// returned.
	Next(ctx context.Context, d *Decision) error
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

// PanicReporter is an optional Exchange method: Run calls Panicked with
// the cause (the panic value and stack) after releasing the key, before
// answering, so that the framework's own error reporting sees it (ginidem
// adds it to c.Errors for logging middleware).
type PanicReporter interface {
	Panicked(cause error)
}

// Serve runs one request through idem: Decide, then, by outcome, the
// chain untouched (Bypass), the stored or problem response (Replay,
// Reject), the user's error handler (store failure), or Run (Proceed). The
// error is the one the framework should see (a handler's rendered error
// is not returned again; an error handler's returned error is).
func (e *Engine) Serve(ctx context.Context, req Request, x Exchange) error {
	d, err := e.Decide(ctx, req)
	if err != nil {
		return e.answerError(x, err, d.Response)
	}
	switch d.Outcome {
	case Bypass:
		return x.Next(ctx, nil)
	case Replay, Reject:
		return x.Write(d.Response)
	}
	return e.Run(ctx, d, x)
}

// Run runs the handler for a Proceed decision and does everything after
// it: the handler runs on d.Context(ctx) with its response captured; a
// panic releases the key (Abort) and answers a 500 problem (or, when the
// response already went out or the panic is http.ErrAbortHandler, panics
// with http.ErrAbortHandler so the server drops the connection); a handler
// error that wrote nothing answers a 500 problem, classified by the
// outcome policy like any 500; otherwise the captured response is
// committed and sent. A failed Commit answers through the error handler
// with CommitErrorResponse instead of the handler's response.
func (e *Engine) Run(ctx context.Context, d *Decision, x Exchange) (rerr error) {
	lctx := d.Context(ctx)
	done := false
	defer func() {
		if done {
			return
		}
		p := recover()
		// Scrubbed here, not only in Abort's log: the panic value goes to
		// the adapter too (gin's c.Errors, which gin's logger prints).
		cause := e.scrub(fmt.Errorf("idem: handler panicked: %v\n%s", p, debug.Stack()), d.Key)
		_ = e.Abort(lctx, d, cause)
		if pr, ok := x.(PanicReporter); ok {
			pr.Panicked(cause)
		}
		if p == http.ErrAbortHandler || !x.Discard() { //nolint:errorlint // sentinel compared as net/http does
			// The response is half out (or the handler asked for the
			// connection to be dropped): let the server drop it.
			panic(http.ErrAbortHandler)
		}
		rerr = x.Write(e.PanicResponse())
	}()
	herr := x.Next(lctx, d)
	done = true

	resp := x.Captured()
	if herr != nil && resp.Status == 0 && len(resp.Body) == 0 && !resp.Streamed && !resp.Truncated {
		// The handler failed and nothing rendered its error: answer a 500
		// problem, and let the policy classify it (retryable by default).
		problem := e.Problem(ProblemHandlerError, "the request failed; it was not completed")
		if err := e.commit(lctx, d, *problem, herr); err != nil {
			x.Discard()
			return e.answerError(x, err, e.CommitErrorResponse(err))
		}
		x.Discard()
		return x.Write(problem)
	}
	if err := e.commit(lctx, d, resp, herr); err != nil {
		if !x.Discard() {
			return nil // already out: the client has it; the error is logged
		}
		return e.answerError(x, err, e.CommitErrorResponse(err))
	}
	return x.Send()
}

// answerError answers a store or commit failure through the user's error
// handler, writing fallback when the handler stays silent.
func (e *Engine) answerError(x Exchange, err error, fallback *Response) error {
	if fallback == nil {
		fallback = e.Problem(ProblemStoreUnavailable, "the idempotency store could not be reached; the request was not processed")
	}
	answered, rerr := x.OnError(err, fallback)
	if answered {
		return rerr
	}
	return x.Write(fallback)
}

// RestoreBody gives r back the body Decide read (when it read one), so the
// handler reads it as if idem were absent.
func (d *Decision) RestoreBody(r *http.Request) {
	if d == nil || !d.BodyRead || r == nil {
		return
	}
	body := d.Body
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// KeyHeader is the engine's idempotency key header, for an adapter that
// masks it ("" when d is not a decision of an engine).
func (d *Decision) KeyHeader() string {
	if d == nil || d.eng == nil {
		return ""
	}
	return d.eng.cfg.header
}

// MaxResponseBytes is the engine's WithMaxResponseBytes, for sizing a
// capture (0 when d is not a decision of an engine).
func (d *Decision) MaxResponseBytes() int {
	if d == nil || d.eng == nil {
		return 0
	}
	return d.eng.cfg.maxResponse
}
