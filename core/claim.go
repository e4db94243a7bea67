package core

import (
	"context"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/core/internal/rerun"
	"github.com/idemkit/idem/core/storekit"
)

// claim asks the store for the key and turns its answer into d: Proceed
// (owned, heartbeat running), Replay, or a Reject (422, 409, not retained,
// 503). With WithWait, an answer "in flight" is asked again until the
// owner finishes or the wait is over.
func (e *Engine) claim(ctx context.Context, d *Decision, claim storekit.ClaimRequest) (*Decision, error) {
	w := e.newWaiter(d.Scope, d.Key)
	if _, ok := rerun.From(ctx); ok {
		w.deadline = time.Time{} // a completer does not wait for a live owner
	}
	defer w.stop()
	for {
		start := e.timing()
		sent := e.cfg.now() // the lease runs from no earlier than this
		res, err := e.store.Claim(ctx, claim)
		took := since(start)
		if err != nil {
			return e.claimFailed(ctx, d, err, took)
		}
		if res.Claimed {
			if m, ok := rerun.From(ctx); ok && (res.Fresh || !res.Record.CreatedAt.Equal(m.Born)) {
				// A completer's re-run created the record anew (the
				// stalled one expired meanwhile): nothing of its steps
				// is left to finish, so nothing runs.
				e.abandonClaim(ctx, d, &res.Record, took)
				return d, nil
			}
			e.own(ctx, d, &res.Record, res.Fresh, sent, took)
			return d, nil
		}
		rec := res.Record
		if rec.Method != claim.Method || rec.Route != claim.Route || rec.Fingerprint != claim.Fingerprint {
			e.refuse(ctx, d, EventMismatch, problem.PayloadMismatch, http.StatusUnprocessableEntity, took,
				"this idempotency key was already used with a different request; use a new key for a new request")
			return d, nil
		}
		if rec.Status == storekit.StatusCompleted && rec.Response != nil {
			e.completed(ctx, d, rec.Response, took)
			return d, nil
		}
		// In flight (or failed/completed in a way the store did not let us
		// take over): wait if configured, else 409.
		if w.wait(ctx) {
			continue
		}
		e.conflict(ctx, d, rec.LockedUntil.Sub(res.Now), took)
		return d, nil
	}
}

// claimFailed answers a claim the store did not make: the client went
// away (nothing claimed, the answer goes nowhere), or the store failed (503,
// and the error is returned).
func (e *Engine) claimFailed(ctx context.Context, d *Decision, err error, took time.Duration) (*Decision, error) {
	if ctx.Err() != nil {
		err = e.scrub(err, d.Key)
		e.observe(Event{Kind: EventCanceled, Problem: problem.Canceled, Scope: d.Scope, Route: d.route, Status: statusClientClosedRequest, Duration: took, Err: err})
		e.log(ctx, slog.LevelInfo, "canceled", d.Key, d.Scope, d.route, slog.Any("err", err))
		d.answer(Reject, problem.Canceled, e.problem(problem.Canceled, "the request was cancelled before it was processed"))
		return d, nil
	}
	err = e.scrub(fmt.Errorf("idem: claim: %w", err), d.Key)
	e.observe(Event{Kind: EventStoreError, Problem: problem.StoreUnavailable, Scope: d.Scope, Route: d.route, Status: http.StatusServiceUnavailable, Duration: took, Err: err})
	e.log(ctx, slog.LevelError, "store_error", d.Key, d.Scope, d.route, slog.Any("err", err))
	d.answer(Reject, problem.StoreUnavailable, e.problem(problem.StoreUnavailable,
		"the idempotency store could not be reached; the request was not processed"))
	return d, err
}

// own makes d the owner of the record it claimed: its lease, fenced by the
// record's token, renewed by a heartbeat from sent on.
func (e *Engine) own(ctx context.Context, d *Decision, rec *storekit.Record, fresh bool, sent time.Time, took time.Duration) {
	d.Outcome = Proceed
	d.own = &owner{lease: grant{fence: storekit.Fence{Scope: d.Scope, Key: d.Key, Token: rec.Token}, store: e.store, fresh: fresh,
		born: rec.CreatedAt, fp: rec.Fingerprint}}
	d.lease = &d.own.lease
	d.lease.lose = d.loseLease
	d.startHeartbeat(sent)
	kind := EventClaim
	if m, ok := rerun.From(ctx); ok {
		kind = EventStalled
		if m.Took != nil {
			m.Took.Store(true)
		}
	}
	e.observe(Event{Kind: kind, Scope: d.Scope, Route: d.route, Duration: took})
	e.log(ctx, slog.LevelInfo, "claim", d.Key, d.Scope, d.route, slog.Int64("token", rec.Token))
}

// completed answers a key whose request has completed: its stored response
// replayed, or 409 when the response was not kept.
func (e *Engine) completed(ctx context.Context, d *Decision, sr *storekit.StoredResponse, took time.Duration) {
	if sr.NotRetained {
		e.refuse(ctx, d, EventNotRetained, problem.NotRetained, http.StatusConflict, took,
			"the request with this key completed with status "+strconv.Itoa(sr.Status)+
				" but its response was too large or streamed to keep; it will not be run again")
		return
	}
	d.Outcome = Replay
	d.Response = replayResponse(sr, e.cfg.replayed)
	e.observe(Event{Kind: EventReplay, Scope: d.Scope, Route: d.route, Status: d.Response.Status, Duration: took})
	e.log(ctx, slog.LevelInfo, "replay", d.Key, d.Scope, d.route, slog.Int("status", d.Response.Status))
}

// conflict answers 409 in-flight, with a Retry-After that never points past
// the owner's lease (left): most owners finish within a second or two, and
// a dead one is taken over when its lease lapses.
func (e *Engine) conflict(ctx context.Context, d *Decision, left, took time.Duration) {
	hint := min(e.cfg.retryAfter, left)
	retry := max(int64((hint+time.Second-1)/time.Second), 1)
	e.refuse(ctx, d, EventConflict, problem.InFlight, http.StatusConflict, took,
		"a request with this idempotency key is still being processed; retry after the indicated delay")
	d.Response.Header.Set("Retry-After", strconv.FormatInt(retry, 10))
}

// refuse makes d a Reject after the claim, with its event and log line.
func (e *Engine) refuse(ctx context.Context, d *Decision, kind string, pname string, status int, took time.Duration, detail string) {
	e.observe(Event{Kind: kind, Problem: pname, Scope: d.Scope, Route: d.route, Status: status, Duration: took})
	level := slog.LevelInfo
	if kind == EventMismatch {
		level = slog.LevelWarn
	}
	e.log(ctx, level, string(kind), d.Key, d.Scope, d.route)
	d.answer(Reject, pname, e.problem(pname, detail))
}

// waiter paces WithWait: a duplicate asks again when the store reports a
// change to the key (storekit.Watcher) or, without one, on a poll that
// doubles up to ten times WithWaitPoll, until the wait is over.
type waiter struct {
	e        *Engine
	scope    string
	key      string
	deadline time.Time // zero: no waiting
	poll     time.Duration
	watcher  storekit.Watcher
	changed  <-chan struct{}
	unwatch  func()
}

// newWaiter returns a value, so that a request that never waits allocates
// nothing for it.
func (e *Engine) newWaiter(scope, key string) waiter {
	w := waiter{e: e, scope: scope, key: key, poll: e.cfg.waitPoll, unwatch: func() {}}
	if e.cfg.wait > 0 {
		w.deadline = e.cfg.now().Add(e.cfg.wait)
	}
	w.watcher, _ = e.store.(storekit.Watcher)
	return w
}

func (w *waiter) arm(ctx context.Context) {
	w.changed, w.unwatch = w.watcher.Watch(ctx, w.scope, w.key)
	if w.unwatch == nil {
		w.unwatch = func() {}
	}
	if w.changed == nil { // a storekit.Watcher that cannot watch: poll instead
		w.watcher = nil
	}
}

func (w *waiter) stop() { w.unwatch() }

// wait returns true when the key should be asked again, false when the
// duplicate is to be answered now (no wait configured, the wait is over,
// or ctx is done).
func (w *waiter) wait(ctx context.Context) bool {
	if w.deadline.IsZero() || ctx.Err() != nil {
		return false
	}
	left := w.deadline.Sub(w.e.cfg.now())
	if left <= 0 {
		return false
	}
	if w.watcher != nil && w.changed == nil {
		// Watch from now on, then look again: a change between the claim
		// and the watch is caught by the next claim.
		w.arm(ctx)
		return true
	}
	t := time.NewTimer(min(w.poll, left))
	select {
	case <-t.C:
	case <-w.changed: // nil without a Watcher: never ready
		// Re-arm before looking again, so no change is missed.
		w.unwatch()
		w.arm(ctx)
	case <-ctx.Done():
	}
	t.Stop()
	w.poll = min(w.poll*2, 10*w.e.cfg.waitPoll)
	return ctx.Err() == nil
}
