package core

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
)

// Commit records the handler's response for the decision's key: final
// responses are stored for replay, retryable ones (see WithRetryable)
// mark the key failed so it may be retried. The write is fenced by the lease
// token: a stale owner gets an error wrapping ErrLeaseLost and changes
// nothing. Commit runs on a context detached from ctx's cancellation, bounded
// by the commit timeout, so a client disconnect cannot strand a key.
//
// A response with Status 0 and no body (the handler wrote nothing) while ctx
// is done (the client went away) is treated as Abort.
//
// When Commit fails, the response is not known to be durable: adapters
// answer (Serve does it) with a problem instead of the handler's response,
// or cut that response if it already went out (streamed), so that it never
// reaches the client complete.
func (e *Engine) Commit(ctx context.Context, d *Decision, resp adapterkit.Response) error {
	return e.commit(ctx, d, resp, nil)
}

// commit is Commit with the handler's error, if it returned one: logged
// and reported in the event.
func (e *Engine) commit(ctx context.Context, d *Decision, resp adapterkit.Response, cause error) error {
	if err := d.finish(e); err != nil {
		return err
	}
	start := time.Now()
	cctx := e.detached(ctx, d, start)
	defer cctx.cancel(context.Canceled)
	status := resp.Status
	if status == 0 {
		status = http.StatusOK
	}
	var err error
	kind := EventCommit
	switch {
	case resp.Status == 0 && len(resp.Body) == 0 && ctx != nil && ctx.Err() != nil:
		// The client went away and the handler gave up without answering:
		// that is no result to replay. Release the key.
		kind = EventAbort
		err = e.store.Fail(cctx, d.lease.fence)
	case e.cfg.retryable(status):
		kind = EventFail
		err = e.store.Fail(cctx, d.lease.fence)
	case resp.Streamed || resp.Truncated:
		err = e.store.Complete(cctx, d.lease.fence, storekit.StoredResponse{Status: status, NotRetained: true})
	default:
		body := resp.Body
		if body == nil {
			body = []byte{}
		}
		err = e.store.Complete(cctx, d.lease.fence, storekit.StoredResponse{Status: status, Header: e.keptHeaders(&resp), Body: body})
	}
	if cause != nil {
		cause = e.scrub(fmt.Errorf("idem: handler error: %w", cause), d.Key)
		e.log(ctx, slog.LevelWarn, "handler_error", d.Key, d.Scope, d.route, slog.Any("err", cause))
	}
	return e.finished(ctx, d, kind, status, e.took(start), err, cause)
}

// Abort releases the key after a handler failure (panic, error, client
// disconnect): the record becomes failed and a retry may run the handler
// again. Store-attached resources (pgstore's transaction) are rolled back.
// Like Commit it is fenced and runs on a detached context.
func (e *Engine) Abort(ctx context.Context, d *Decision, cause error) error {
	if err := d.finish(e); err != nil {
		return err
	}
	start := time.Now()
	cctx := e.detached(ctx, d, start)
	defer cctx.cancel(context.Canceled)
	err := e.store.Fail(cctx, d.lease.fence)
	if cause != nil {
		cause = e.scrub(cause, d.Key)
		e.log(ctx, slog.LevelWarn, "abort_cause", d.Key, d.Scope, d.route, slog.Any("cause", cause))
	}
	return e.finished(ctx, d, EventAbort, 0, e.took(start), err, cause)
}

// commitErrorResponse is what an adapter writes instead of the handler's
// response when Commit or Abort failed: the outcome is not known to be
// recorded, so the client must not take it as final. A lost lease answers
// 409 (another request owns the key now); writes the store found not
// committed (ErrNotCommitted: the handler ended the store's transaction)
// 500; anything else 503. All invite a retry, which the record then
// resolves.
func (e *Engine) commitErrorResponse(err error) *adapterkit.Response {
	if errors.Is(err, storekit.ErrNotCommitted) {
		return e.problem(problem.HandlerError, "the request failed: its writes did not commit; it was not completed")
	}
	if errors.Is(err, ErrLeaseLost) {
		return e.problem(problem.InFlight,
			"this request lost ownership of its idempotency key to a retry; retry to get the recorded result")
	}
	return e.problem(problem.StoreUnavailable, "the result of this request could not be recorded; retry with the same key")
}

// detached returns the context of the decision's one Commit or Abort: ctx's
// values and the lease, none of ctx's cancellation, and the commit timeout.
// The caller cancels it when done; now is the caller's clock reading.
func (e *Engine) detached(ctx context.Context, d *Decision, now time.Time) *commitCtx {
	if ctx == nil {
		ctx = context.Background()
	}
	c := &d.own.cctx
	*c = commitCtx{values: context.WithoutCancel(ctx), lease: d.lease, deadline: now.Add(e.cfg.commitTimeout)}
	return c
}

// finished reports the end of a Commit or Abort: err is the store's,
// cause the handler's failure (event only).
func (e *Engine) finished(ctx context.Context, d *Decision, kind string, status int, took time.Duration, err, cause error) error {
	d.release()
	if err != nil {
		pname := problem.StoreUnavailable
		switch {
		case errors.Is(err, ErrLeaseLost):
			kind, pname = EventLeaseLost, problem.InFlight
		case errors.Is(err, storekit.ErrNotCommitted):
			pname = problem.HandlerError
		}
		err = e.scrub(fmt.Errorf("idem: %s: %w", kind, err), d.Key)
		e.observe(Event{Kind: kind, Problem: pname, Scope: d.Scope, Route: d.route, Status: status, Duration: took, Err: err})
		e.log(ctx, slog.LevelError, string(kind), d.Key, d.Scope, d.route, slog.Any("err", err))
		return err
	}
	e.observe(Event{Kind: kind, Scope: d.Scope, Route: d.route, Status: status, Duration: took, Err: cause})
	e.log(ctx, slog.LevelInfo, string(kind), d.Key, d.Scope, d.route, slog.Int("status", status))
	return nil
}

// finish marks the decision finished and stops its heartbeat.
func (d *Decision) finish(e *Engine) error {
	if d == nil || d.Outcome != Proceed || d.own == nil || d.eng != e {
		return errNotOwner
	}
	o := d.own
	o.mu.Lock()
	if o.finished {
		o.mu.Unlock()
		return ErrFinished
	}
	o.finished = true
	hbCancel := o.hbCancel
	if o.hbStop != nil {
		close(o.hbStop)
	}
	o.mu.Unlock()
	if hbCancel != nil {
		hbCancel() // a pending renewal is moot now: do not wait for it
	}
	if e.hb.remove(o) {
		o.hbLoop.Done() // the loop will never start
	}
	// Otherwise the loop started (or is starting): it sees finished and
	// returns; wait for it.
	o.hbLoop.Wait()
	return nil
}

// release cancels the handler contexts: the execution is over.
func (d *Decision) release() {
	o := d.own
	o.mu.Lock()
	cancels := o.cancels
	o.cancels = nil
	o.mu.Unlock()
	for _, c := range cancels {
		c(ErrFinished)
	}
}
