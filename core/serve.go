package core

import (
	"context"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"runtime/debug"

	"github.com/idemkit/idem/core/adapterkit"
)

// Serve runs one request through idem: Decide, then, by outcome, the
// chain untouched (Bypass), the stored or problem response (Replay,
// Reject), the user's error handler (store failure), or the handler
// under the lease (Proceed). The
// error is the one the framework should see (a handler's rendered error
// is not returned again; an error handler's returned error is).
func (e *Engine) Serve(ctx context.Context, req Request, x adapterkit.Exchange) error {
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
	return e.run(ctx, d, x)
}

// run runs the handler for a Proceed decision and does everything after
// it: the handler runs on d.Context(ctx) with its response captured; a
// panic releases the key (Abort) and answers a 500 problem (or, when the
// response already went out or an HTTP handler's panic is
// http.ErrAbortHandler, panics with http.ErrAbortHandler so the server
// drops the connection); a handler
// error that wrote nothing answers a 500 problem, classified by the
// outcome policy like any 500; otherwise the captured response is
// committed and sent. A failed Commit answers through the error handler
// with commitErrorResponse instead of the handler's response or, when that
// response already went out, panics with http.ErrAbortHandler so the server
// cuts it short.
func (e *Engine) run(ctx context.Context, d *Decision, x adapterkit.Exchange) (rerr error) {
	lctx := d.Context(ctx)
	// The adapter's view of the decision lives in the owner's allocation.
	p := new(adapterkit.Proceed)
	if d.own != nil {
		p = &d.own.proceed
	}
	*p = adapterkit.Proceed{Key: d.Key, KeyHeader: e.cfg.header, Body: d.Body, BodyRead: d.BodyRead, MaxResponseBytes: e.cfg.maxResponse}
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
		if pr, ok := x.(adapterkit.PanicReporter); ok {
			pr.Panicked(cause)
		}
		// A call (Engine.Call) has no connection to drop: its panic is
		// returned like any other.
		_, call := x.(*callExchange)
		if (p == http.ErrAbortHandler && !call) || !x.Discard() { //nolint:errorlint // sentinel compared as net/http does
			// The response is half out (or the handler asked for the
			// connection to be dropped): let the server drop it.
			cut(x)
		}
		rerr = x.Write(e.panicResponse())
	}()
	herr := x.Next(lctx, p)
	done = true

	resp := x.Captured()
	empty := resp.Status == 0 && len(resp.Body) == 0 && !resp.Streamed && !resp.Truncated
	var lost error
	if empty { // the lock only for a handler that answered nothing
		lost = d.lostLease()
	}
	if lost != nil {
		// idem stopped the handler (its lease is gone) and it answered
		// nothing: its framework would send a 200 with an empty body,
		// which reads as success. The commit releases the key (an empty
		// response on a cancelled context); the client is told to retry.
		if err := e.commit(lctx, d, resp, herr); err != nil {
			x.Discard()
			return e.answerError(x, err, e.commitErrorResponse(err))
		}
		x.Discard()
		return x.Write(e.commitErrorResponse(lost))
	}
	if herr != nil && empty {
		// The handler failed and nothing rendered its error: answer a 500
		// problem, and let the policy classify it (retryable by default).
		problem := e.problem(problem.HandlerError, "the request failed; it was not completed")
		if err := e.commit(lctx, d, *problem, herr); err != nil {
			x.Discard()
			return e.answerError(x, err, e.commitErrorResponse(err))
		}
		x.Discard()
		return x.Write(problem)
	}
	if err := e.commit(lctx, d, resp, herr); err != nil {
		if !x.Discard() {
			// Already out (flushed, hijacked, over the limit) but not
			// recorded: a retry may run the handler again (in
			// transactional mode its writes rolled back). Cut the response
			// so the client cannot take it for a completed success and
			// retries. The error is logged.
			cut(x)
		}
		return e.answerError(x, err, e.commitErrorResponse(err))
	}
	return x.Send()
}

// cut ends a response that must not look complete: the adapter cuts the
// connection if its framework could swallow the panic (adapterkit.Cutter),
// and http.ErrAbortHandler makes the server drop it.
func cut(x adapterkit.Exchange) {
	if c, ok := x.(adapterkit.Cutter); ok {
		c.Cut()
	}
	panic(http.ErrAbortHandler)
}

// answerError answers a store or commit failure through the user's error
// handler, writing fallback when the handler stays silent.
func (e *Engine) answerError(x adapterkit.Exchange, err error, fallback *adapterkit.Response) error {
	if fallback == nil {
		fallback = e.problem(problem.StoreUnavailable, "the idempotency store could not be reached; the request was not processed")
	}
	answered, rerr := x.OnError(err, fallback)
	if answered {
		return rerr
	}
	return x.Write(fallback)
}
