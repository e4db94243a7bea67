package otelidem

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// Store wraps s so that each call idem makes to it is a span, a child of
// the span in the call's context (the request's). The wrapper keeps s's
// optional capabilities: it is a storekit.Watcher (waits are measured whether
// or not s is one), and it exposes s through Unwrap, which pgstore.Tx,
// mysqlstore.Tx and core.Step look through.
func (t *Telemetry) Store(s core.Store) core.Store {
	return &store{s: s, t: t}
}

type store struct {
	s core.Store
	t *Telemetry
}

var (
	_ core.Store       = (*store)(nil)
	_ storekit.Watcher = (*store)(nil)
)

// Unwrap returns the wrapped store.
func (s *store) Unwrap() core.Store { return s.s }

func (s *store) start(ctx context.Context, name, scope string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if s.t.cfg.scope && scope != "" {
		attrs = append(attrs, attrScope.String(scope))
	}
	return s.t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// end closes span, recording err with the key (and the scope, unless
// WithScopeAttribute) redacted: stores are not supposed to put keys in
// their errors, but a span exported to a vendor is the wrong place to find
// out one did.
func (s *store) end(span trace.Span, scope, key string, err error) {
	if err != nil {
		// Every form of the key (quoted, escaped, hex), at any length:
		// core's rule, the one the engine's logs follow.
		msg := storekit.ScrubText(err.Error(), key)
		if scope != "" && !s.t.cfg.scope {
			msg = strings.ReplaceAll(msg, scope, "<scope>")
		}
		span.AddEvent("exception", trace.WithAttributes(
			attribute.String("exception.type", errType(err)),
			attribute.String("exception.message", msg)))
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}

func errType(err error) string {
	switch {
	case errors.Is(err, core.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return "store_error"
}

// claimOutcome names what a claim found, from the store's answer alone
// (the engine's decision follows from it; see core.Store.Claim).
func claimOutcome(req storekit.ClaimRequest, res storekit.ClaimResult) string {
	r := res.Record
	switch {
	case res.Claimed:
		return "claimed"
	case r.Method != req.Method || r.Route != req.Route || r.Fingerprint != req.Fingerprint:
		return "mismatch"
	case r.Status == storekit.StatusCompleted && r.Response != nil && r.Response.NotRetained:
		return "not_retained"
	case r.Status == storekit.StatusCompleted:
		return "replay"
	}
	return "in_flight"
}

func (s *store) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	sctx, span := s.start(ctx, "idem.claim", req.Scope, attrRoute.String(req.Route), attrMethod.String(req.Method))
	res, err := s.s.Claim(sctx, req)
	outcome := ""
	if err == nil {
		outcome = claimOutcome(req, res)
		span.SetAttributes(attrClaim.String(outcome), attrRecStatus.String(string(res.Record.Status)))
	}
	s.end(span, req.Scope, req.Key, err)
	s.t.waiting.claimed(ctx, outcome)
	return res, err
}

func (s *store) Heartbeat(ctx context.Context, f storekit.Fence, extend time.Duration) error {
	sctx, span := s.start(ctx, "idem.heartbeat", f.Scope)
	err := s.s.Heartbeat(sctx, f, extend)
	span.SetAttributes(attrFencedOut.Bool(errors.Is(err, core.ErrLeaseLost)))
	s.end(span, f.Scope, f.Key, err)
	return err
}

func (s *store) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	sctx, span := s.start(ctx, "idem.complete", f.Scope, attrStatus.Int(resp.Status))
	err := s.s.Complete(sctx, f, resp)
	span.SetAttributes(attrFencedOut.Bool(errors.Is(err, core.ErrLeaseLost)))
	s.end(span, f.Scope, f.Key, err)
	return err
}

func (s *store) Fail(ctx context.Context, f storekit.Fence) error {
	sctx, span := s.start(ctx, "idem.fail", f.Scope)
	err := s.s.Fail(sctx, f)
	span.SetAttributes(attrFencedOut.Bool(errors.Is(err, core.ErrLeaseLost)))
	s.end(span, f.Scope, f.Key, err)
	return err
}

func (s *store) Get(ctx context.Context, scope, key string) (storekit.Record, error) {
	sctx, span := s.start(ctx, "idem.get", scope)
	r, err := s.s.Get(sctx, scope, key)
	if errors.Is(err, storekit.ErrNotFound) {
		s.end(span, scope, key, nil)
		return r, err
	}
	s.end(span, scope, key, err)
	return r, err
}

// Watch implements storekit.Watcher: the wait is measured, and the wrapped
// store's Watch used when it has one (otherwise nil: the engine polls).
func (s *store) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	s.t.waiting.watch(ctx, scope)
	if w, ok := s.s.(storekit.Watcher); ok {
		return w.Watch(ctx, scope, key)
	}
	return nil, func() {}
}

// waitTracker turns the engine's watch calls into waits: a wait starts at
// a request's first Watch and ends at its next claim that is no longer in
// flight, or when the request's context ends (the duplicate gave up: 409).
// A waiting duplicate re-arms its watch after every change of the record,
// so watches are not waits. Keyed by the request's context, which the
// engine passes to every call of one Decide.
type waitTracker struct {
	t      *Telemetry
	active atomic.Int64 // len(m): claims skip the lock when nobody waits
	mu     sync.Mutex
	m      map[context.Context]*wait
}

type wait struct {
	start time.Time
	span  trace.Span
	stop  func() bool
	scope string
}

func (w *waitTracker) init(t *Telemetry) {
	w.t = t
	w.m = make(map[context.Context]*wait)
}

func (w *waitTracker) watch(ctx context.Context, scope string) {
	if !keyable(ctx) {
		return // cannot be a map key; such a context's waits go uncounted
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.m[ctx]; ok {
		return // re-armed
	}
	var attrs []attribute.KeyValue
	if w.t.cfg.scope && scope != "" {
		attrs = append(attrs, attrScope.String(scope))
	}
	_, span := w.t.tracer.Start(ctx, "idem.wait", trace.WithAttributes(attrs...))
	wt := &wait{start: time.Now(), span: span, scope: scope}
	w.m[ctx] = wt
	w.active.Add(1)
	w.t.waits.Add(context.Background(), 1, metric.WithAttributes(attrs...))
	// A context that never ends (Background) keeps its entry until its
	// next claim resolves; a request context always ends.
	wt.stop = context.AfterFunc(ctx, func() { w.done(ctx, "gave_up") })
}

func (w *waitTracker) claimed(ctx context.Context, outcome string) {
	if outcome == "in_flight" || w.active.Load() == 0 {
		return
	}
	w.done(ctx, outcome)
}

// keyable reports whether ctx can be a map key (a context type that is a
// non-comparable struct value would panic).
func keyable(ctx context.Context) bool {
	return ctx != nil && reflect.TypeOf(ctx).Comparable()
}

func (w *waitTracker) done(ctx context.Context, outcome string) {
	if !keyable(ctx) {
		return
	}
	w.mu.Lock()
	wt, ok := w.m[ctx]
	if ok {
		delete(w.m, ctx)
		w.active.Add(-1)
	}
	w.mu.Unlock()
	if !ok {
		return
	}
	wt.stop()
	if outcome == "" {
		outcome = "store_error"
	}
	attrs := []attribute.KeyValue{attrClaim.String(outcome)}
	if w.t.cfg.scope && wt.scope != "" {
		attrs = append(attrs, attrScope.String(wt.scope))
	}
	w.t.waitDur.Record(context.Background(), time.Since(wt.start).Seconds(), metric.WithAttributes(attrs...))
	wt.span.SetAttributes(attrs...)
	wt.span.End()
}
