package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
)

// Decide classifies a request. A non-nil error means a system failure (the
// store could not be reached): the decision is then a Reject carrying a 503
// problem, and the handler must not run. Every other refusal is a Reject
// with a nil error.
func (e *Engine) Decide(ctx context.Context, req Request) (*Decision, error) {
	method := strings.ToUpper(req.Method)
	claimRoute := CanonicalRoute(req.Route)
	route := claimRoute // what events and logs name: a template, never a client's path
	if req.RouteIsPath {
		route = ""
	}
	if !e.cfg.methods[method] && !req.call {
		return e.bypass(route), nil
	}
	if _, nested := LeaseFromContext(ctx); nested {
		// idem mounted twice (globally and on the route), or a handler
		// serving an internal request on its own context: the execution is
		// already owned; claiming again would only refuse ourselves.
		return e.bypass(route), nil
	}
	if req.NoRoute != nil && req.NoRoute() {
		// No route matches (idem mounted globally, a scanner's path): the
		// framework's own 404 or 405 goes out; no key is required and no
		// record is written for a path nobody serves. The raw path is not
		// a route: the event carries none.
		return e.bypass(""), nil
	}
	key, err := ParseKey(req.values(e.cfg.header))
	if errors.Is(err, ErrKeyMissing) {
		if !e.cfg.required {
			// Named, so a staged roll-out can count the clients that send
			// no key yet before requiring one.
			e.observe(Event{Kind: EventBypass, Problem: ProblemMissingKey, Route: route})
			return &Decision{Outcome: Bypass, eng: e}, nil
		}
		return e.reject(ctx, route, ProblemMissingKey, "the "+e.cfg.header+" header is required for "+method+" requests", nil), nil
	}
	if err != nil {
		return e.reject(ctx, route, ProblemInvalidKey, err.Error(), nil), nil
	}
	scope, err := e.scopeOf(ctx, &req)
	if err == nil && scope == "" && !e.cfg.sharedKeySpace {
		// No tenant, however it came about (no Request.Scope, or a scope
		// function answering ("", nil)): the "" key space is shared by
		// every such request, so it is refused unless the engine opted in.
		err = ErrNoScope
	}
	if err != nil {
		// The scope function's error says why (no session, auth backend
		// down): logged and in the event, never in the answer.
		err = e.scrub(fmt.Errorf("idem: scope: %w", err), key)
		return e.reject(ctx, route, ProblemScopeUnavailable, "the request's tenant could not be determined", err), nil
	}

	var (
		body     []byte
		tooLarge bool
	)
	inMemory := req.BodyBytes
	if req.BodyBytesFunc != nil {
		// Asked only now, after every check above: nothing is read for a
		// request refused or let through.
		if inMemory = req.BodyBytesFunc(); inMemory == nil {
			inMemory = []byte{}
		}
	}
	read := inMemory == nil
	if read {
		body, tooLarge, err = readBody(req.Body, e.cfg.maxRequest)
	} else {
		body, tooLarge = inMemory, int64(len(inMemory)) > e.cfg.maxRequest
	}
	if tooLarge || isMaxBytesError(err) { // our limit, or one set outside (http.MaxBytesReader)
		return e.reject(ctx, route, ProblemBodyTooLarge, "the request body exceeds "+strconv.FormatInt(e.cfg.maxRequest, 10)+" bytes", nil), nil
	}
	if err != nil {
		// The client went away or sent a broken body; nothing was claimed.
		return e.reject(ctx, route, ProblemBodyUnreadable, "the request body could not be read", e.scrub(err, key)), nil
	}

	claim := storekit.ClaimRequest{
		Scope:  scope,
		Key:    key,
		Method: method,
		Route:  claimRoute,
		Fingerprint: Fingerprint(FingerprintInput{
			Method: method, Route: claimRoute, Target: req.Target, Body: body,
			Header: req.fingerprintHeader(e.cfg.fpHeaders), Headers: e.cfg.fpHeaders, CanonicalJSON: e.cfg.canonicalJSON,
		}),
		Lease:     e.cfg.lease,
		Retention: e.cfg.retention,
	}
	d := &Decision{Key: key, Scope: scope, BodyRead: read, eng: e, route: route}
	if read {
		d.Body = body
	}

	var deadline time.Time
	if e.cfg.wait > 0 {
		deadline = e.cfg.now().Add(e.cfg.wait)
	}
	poll := e.cfg.waitPoll
	watcher, _ := e.store.(storekit.Watcher)
	var changed <-chan struct{}
	unwatch := func() {}
	defer func() { unwatch() }()
	arm := func() {
		changed, unwatch = watcher.Watch(ctx, scope, key)
		if unwatch == nil {
			unwatch = func() {}
		}
		if changed == nil { // a storekit.Watcher that cannot watch: poll instead
			watcher = nil
		}
	}
	for {
		start := e.timing()
		sent := e.cfg.now() // the lease runs from no earlier than this
		res, err := e.store.Claim(ctx, claim)
		took := since(start)
		if err != nil && ctx.Err() != nil {
			// The client went away before the claim: not a store failure,
			// and nothing was claimed. The answer goes nowhere.
			err = e.scrub(err, key)
			e.observe(Event{Kind: EventCanceled, Problem: ProblemCanceled, Scope: scope, Route: route, Status: StatusClientClosedRequest, Duration: took, Err: err})
			e.log(ctx, slog.LevelInfo, "canceled", key, scope, route, slog.Any("err", err))
			d.answer(Reject, ProblemCanceled, e.problem(ProblemCanceled, "the request was cancelled before it was processed"))
			return d, nil
		}
		if err != nil {
			err = e.scrub(fmt.Errorf("idem: claim: %w", err), key)
			e.observe(Event{Kind: EventStoreError, Problem: ProblemStoreUnavailable, Scope: scope, Route: route, Status: http.StatusServiceUnavailable, Duration: took, Err: err})
			e.log(ctx, slog.LevelError, "store_error", key, scope, route, slog.Any("err", err))
			d.answer(Reject, ProblemStoreUnavailable, e.problem(ProblemStoreUnavailable,
				"the idempotency store could not be reached; the request was not processed"))
			return d, err
		}
		if res.Claimed {
			d.Outcome = Proceed
			rec := &res.Record
			d.own = &owner{lease: Lease{fence: storekit.Fence{Scope: scope, Key: key, Token: rec.Token}, store: e.store, fresh: res.Fresh,
				born: rec.CreatedAt, fp: rec.Fingerprint, legacy: e.legacyRelay(rec.CreatedAt)}}
			d.lease = &d.own.lease
			d.lease.lose = d.loseLease
			d.startHeartbeat(sent)
			e.observe(Event{Kind: EventClaim, Scope: scope, Route: route, Duration: took})
			e.log(ctx, slog.LevelInfo, "claim", key, scope, route, slog.Int64("token", res.Record.Token))
			return d, nil
		}
		rec := res.Record
		if rec.Method != method || rec.Route != claim.Route || rec.Fingerprint != claim.Fingerprint {
			if legacy, ok := legacyClaim(claim, rec, req.Route, req.Target, body, &req, e); ok {
				// Written by a release that recorded the framework's own
				// spelling of the route: the same request. Claim it (or
				// read it) under its recorded identity.
				claim = legacy
				continue
			}
			e.observe(Event{Kind: EventMismatch, Problem: ProblemPayloadMismatch, Scope: scope, Route: route, Status: http.StatusUnprocessableEntity, Duration: took})
			e.log(ctx, slog.LevelWarn, "mismatch", key, scope, route)
			d.answer(Reject, ProblemPayloadMismatch, e.problem(ProblemPayloadMismatch,
				"this idempotency key was already used with a different request; use a new key for a new request"))
			return d, nil
		}
		if rec.Status == storekit.StatusCompleted && rec.Response != nil {
			if rec.Response.NotRetained {
				e.observe(Event{Kind: EventNotRetained, Problem: ProblemNotRetained, Scope: scope, Route: route, Status: http.StatusConflict, Duration: took})
				e.log(ctx, slog.LevelInfo, "not_retained", key, scope, route)
				d.answer(Reject, ProblemNotRetained, e.problem(ProblemNotRetained,
					"the request with this key completed with status "+strconv.Itoa(rec.Response.Status)+
						" but its response was too large or streamed to keep; it will not be run again"))
				return d, nil
			}
			d.Outcome = Replay
			d.Response = replayResponse(rec.Response)
			e.observe(Event{Kind: EventReplay, Scope: scope, Route: route, Status: d.Response.Status, Duration: took})
			e.log(ctx, slog.LevelInfo, "replay", key, scope, route, slog.Int("status", d.Response.Status))
			return d, nil
		}
		// In flight (or failed/completed in a way the store did not let us
		// take over): wait if configured, else 409.
		if !deadline.IsZero() && ctx.Err() == nil {
			if left := deadline.Sub(e.cfg.now()); left > 0 {
				if watcher != nil && changed == nil {
					// Watch from now on, then look again: a change between the
					// claim above and the watch is caught by the next claim.
					arm()
					continue
				}
				t := time.NewTimer(min(poll, left))
				select {
				case <-t.C:
				case <-changed: // nil without a Watcher: never ready
					// Re-arm before looking again, so no change is missed.
					unwatch()
					arm()
				case <-ctx.Done():
				}
				t.Stop()
				poll = min(poll*2, 10*e.cfg.waitPoll)
				if ctx.Err() == nil {
					continue
				}
			}
		}
		// Most owners finish within a second or two; a dead one is taken
		// over when its lease lapses, so never hint past that.
		hint := e.cfg.retryAfter
		if left := rec.LockedUntil.Sub(res.Now); left < hint {
			hint = left
		}
		retry := max(int64((hint+time.Second-1)/time.Second), 1)
		e.observe(Event{Kind: EventConflict, Problem: ProblemInFlight, Scope: scope, Route: route, Status: http.StatusConflict, Duration: took})
		e.log(ctx, slog.LevelInfo, "conflict", key, scope, route)
		d.answer(Reject, ProblemInFlight, e.problem(ProblemInFlight,
			"a request with this idempotency key is still being processed; retry after the indicated delay"))
		d.Response.Header.Set("Retry-After", strconv.FormatInt(retry, 10))
		return d, nil
	}
}

// scopeOf finds the request's tenant. The default (WithScope not set) is
// requestScope, called directly so that req does not escape to the heap; a
// custom ScopeFunc gets a heap copy, and what it changes in it is kept.
func (e *Engine) scopeOf(ctx context.Context, req *Request) (string, error) {
	if e.cfg.defaultScope || req.call {
		if req.ScopeFunc != nil {
			return req.ScopeFunc(ctx)
		}
		return req.Scope, nil
	}
	if req.Header == nil && req.HeaderReader != nil {
		if all, ok := req.HeaderReader.(interface{ Header() http.Header }); ok {
			req.Header = all.Header()
		}
	}
	r := new(Request)
	*r = *req
	scope, err := e.cfg.scope(ctx, r)
	*req = *r
	return scope, err
}

// isMaxBytesError reports an *http.MaxBytesError in err's chain; a
// separate function, so the target of errors.As is allocated only for an
// error.
func isMaxBytesError(err error) bool {
	if err == nil {
		return false
	}
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

func (e *Engine) bypass(route string) *Decision {
	e.observe(Event{Kind: EventBypass, Route: route})
	return &Decision{Outcome: Bypass, eng: e}
}

// reject refuses a request before the claim. cause, when there is one, is
// logged and reported in the event, never written to the client.
func (e *Engine) reject(ctx context.Context, route, problem, detail string, cause error) *Decision {
	resp := e.problem(problem, detail)
	e.observe(Event{Kind: EventRejected, Problem: problem, Route: route, Status: resp.Status, Err: cause})
	level := slog.LevelInfo
	attrs := []slog.Attr{slog.String("problem", problem), slog.Int("status", resp.Status)}
	if cause != nil {
		level = slog.LevelWarn
		attrs = append(attrs, slog.Any("err", cause))
	}
	e.log(ctx, level, "rejected", "", "", route, attrs...)
	return &Decision{Outcome: Reject, Problem: problem, eng: e, Response: resp}
}

// legacyClaim recognises a record written by a release that recorded the
// route as the framework spelled it ("POST /v1/orders/{id}", "/v1/orders/:id")
// rather than canonically: same method, that spelling, and the fingerprint
// computed over it. It returns the claim to make under the recorded
// identity, so a retry across the upgrade replays (or takes over a failed
// record) instead of answering 422.
func legacyClaim(claim storekit.ClaimRequest, rec storekit.Record, raw, target string, body []byte, req *Request, e *Engine) (storekit.ClaimRequest, bool) {
	if rec.Route != raw {
		// The previous release recorded ServeMux patterns unescaped
		// ("POST /v1/things:batch"), which nethttpidem now escapes for
		// CanonicalRoute ("POST /v1/things\:batch").
		raw = unescapeRoute(raw)
	}
	if raw == claim.Route || rec.Route != raw || rec.Method != claim.Method {
		return claim, false
	}
	fp := Fingerprint(FingerprintInput{
		Method: claim.Method, Route: raw, Target: target, Body: body,
		Header: req.fingerprintHeader(e.cfg.fpHeaders), Headers: e.cfg.fpHeaders, CanonicalJSON: e.cfg.canonicalJSON,
	})
	if fp != rec.Fingerprint {
		return claim, false
	}
	claim.Route, claim.Fingerprint = raw, fp
	return claim, true
}

// replayResponse marks the stored response replayed. The stored response
// is the store's and read-only (see Store): the replay gets a header map of
// its own, whose value slices are the store's, capped so that an append
// reallocates; the body is shared and only read.
func replayResponse(sr *storekit.StoredResponse) *adapterkit.Response {
	h := make(http.Header, len(sr.Header)+1)
	for k, v := range sr.Header {
		h[k] = v[:len(v):len(v)]
	}
	h[ReplayedHeader] = []string{"true"} // h.Set: ReplayedHeader is canonical
	return &adapterkit.Response{Status: sr.Status, Header: h, Body: sr.Body}
}

// readBody reads at most limit bytes. tooLarge reports a body over the limit.
// It is io.ReadAll(io.LimitReader(r, limit+1)) without the LimitReader's
// allocation.
func readBody(r io.Reader, limit int64) (body []byte, tooLarge bool, err error) {
	if r == nil || r == http.NoBody {
		return []byte{}, false, nil
	}
	size := 512
	if lr, ok := r.(interface{ Len() int }); ok && int64(lr.Len()) < limit {
		// bytes.Reader, strings.Reader, bytes.Buffer (fasthttp's body): the
		// exact size, plus one byte so the read that reports EOF needs no
		// growth.
		size = lr.Len() + 1
	}
	body = make([]byte, 0, size)
	for {
		if int64(len(body)) > limit {
			return nil, true, nil
		}
		if len(body) == cap(body) {
			body = append(body, 0)[:len(body)] // grow as append does
		}
		room := cap(body) - len(body)
		// left <= 0 only when limit+1 overflowed (limit math.MaxInt64: no limit).
		if left := limit + 1 - int64(len(body)); left > 0 && left < int64(room) {
			room = int(left)
		}
		n, rerr := r.Read(body[len(body) : len(body)+room])
		body = body[:len(body)+n]
		if rerr == nil {
			continue
		}
		if int64(len(body)) > limit {
			return nil, true, nil
		}
		if rerr == io.EOF {
			return body, false, nil
		}
		return nil, false, fmt.Errorf("idem: read body: %w", rerr)
	}
}
