package core

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/internal/rerun"
	"github.com/idemkit/idem/core/storekit"
)

// Decide classifies a request. A non-nil error means a system failure (the
// store could not be reached): the decision is then a Reject carrying a 503
// problem, and the handler must not run. Every other refusal is a Reject
// with a nil error.
func (e *Engine) Decide(ctx context.Context, req Request) (*Decision, error) {
	method := strings.ToUpper(req.Method)
	claimRoute := adapterkit.CanonicalRoute(req.Route)
	route := claimRoute // what events and logs name: a template, never a client's path
	if req.Route == "" {
		// No template: the path stands in for it in the record.
		path, _, _ := strings.Cut(req.Target, "?")
		claimRoute = adapterkit.CanonicalRoute(path)
	}
	key, scope, early := e.admit(ctx, &req, method, route)
	if early != nil {
		return early, nil
	}
	body, read, early := e.requestBody(ctx, &req, key, route)
	if early != nil {
		return early, nil
	}
	claim := storekit.ClaimRequest{
		Scope:  scope,
		Key:    key,
		Method: method,
		Route:  claimRoute,
		Fingerprint: fingerprint(fingerprintInput{
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
	d, err := e.claim(ctx, d, claim)
	if d != nil && d.lease != nil {
		// Kept only once claimed: a replay, a conflict or a refusal never
		// needs it.
		d.lease.kept = e.keepRequest(ctx, &req, method, claimRoute, body, key)
	}
	return d, err
}

// admit runs the checks that need no body and no store: the method, a
// nested mount, an unrouted path, the key and the scope. A non-nil
// Decision ends the request there (Bypass or Reject).
func (e *Engine) admit(ctx context.Context, req *Request, method, route string) (key, scope string, early *Decision) {
	if !e.cfg.methods[method] && !req.call {
		return "", "", e.bypass(route)
	}
	if _, nested := leaseFrom(ctx); nested {
		// idem mounted twice (globally and on the route), or a handler
		// serving an internal request on its own context: the execution is
		// already owned; claiming again would only refuse ourselves.
		return "", "", e.bypass(route)
	}
	if req.NoRoute != nil && req.NoRoute() {
		// No route matches (idem mounted globally, a scanner's path): the
		// framework's own 404 or 405 goes out; no key is required and no
		// record is written for a path nobody serves. The raw path is not
		// a route: the event carries none.
		return "", "", e.bypass("")
	}
	key, err := parseKey(req.values(e.cfg.header))
	if errors.Is(err, ErrKeyMissing) {
		if !e.cfg.required {
			// Named, so a staged roll-out can count the clients that send
			// no key yet before requiring one.
			e.observe(Event{Kind: EventBypass, Problem: problem.MissingKey, Route: route})
			return "", "", &Decision{Outcome: Bypass, eng: e}
		}
		return "", "", e.reject(ctx, route, problem.MissingKey, "the "+e.cfg.header+" header is required for "+method+" requests", nil)
	}
	if err != nil {
		return "", "", e.reject(ctx, route, problem.InvalidKey, err.Error(), nil)
	}
	if m, ok := rerun.From(ctx); ok {
		// A completer's re-run: the record's own scope (the kept request
		// carries no credentials to find it again).
		scope = m.Scope
	} else {
		scope, err = e.scopeOf(ctx, req)
	}
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
		return "", "", e.reject(ctx, route, problem.ScopeUnavailable, "the request's tenant could not be determined", err)
	}
	return key, scope, nil
}

// requestBody gets the body to fingerprint, within WithMaxRequestBytes:
// the adapter's bytes when it has them, else read from req.Body (read
// reports that, so the adapter hands the bytes on). A non-nil Decision
// refuses the request (413, or 400 for a body that could not be read).
func (e *Engine) requestBody(ctx context.Context, req *Request, key, route string) (body []byte, read bool, early *Decision) {
	var (
		tooLarge bool
		err      error
	)
	// Read (or asked for) only now, after every check above: nothing is
	// read for a request refused or let through.
	var inMemory []byte
	if bb, ok := req.Body.(adapterkit.BodyBytes); ok {
		if bb != nil {
			inMemory = bb()
		}
		if inMemory == nil {
			inMemory = []byte{}
		}
	}
	read = inMemory == nil
	if read {
		body, tooLarge, err = readBody(req.Body, e.cfg.maxRequest)
	} else {
		body, tooLarge = inMemory, int64(len(inMemory)) > e.cfg.maxRequest
	}
	if tooLarge || isMaxBytesError(err) { // our limit, or one set outside (http.MaxBytesReader)
		return nil, read, e.reject(ctx, route, problem.BodyTooLarge, "the request body exceeds "+strconv.FormatInt(e.cfg.maxRequest, 10)+" bytes", nil)
	}
	if err != nil {
		// The client went away or sent a broken body; nothing was claimed.
		return nil, read, e.reject(ctx, route, problem.BodyUnreadable, "the request body could not be read", e.scrub(err, key))
	}
	return body, read, nil
}

// scopeOf finds the request's tenant. The default (WithScope not set) is
// requestScope, called directly so that req does not escape to the heap; a
// custom ScopeFunc gets a heap copy, and what it changes in it is kept.
func (e *Engine) scopeOf(ctx context.Context, req *Request) (string, error) {
	if e.cfg.defaultScope || req.call {
		if req.ScopeFunc != nil {
			// A copy, so that req itself stays off the heap.
			r := *req
			return req.ScopeFunc(ctx, &r)
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

// replayResponse marks the stored response replayed. The stored response
// is the store's and read-only (see Store): the replay gets a header map of
// its own, whose value slices are the store's, capped so that an append
// reallocates; the body is shared and only read.
func replayResponse(sr *storekit.StoredResponse, replayed string) *adapterkit.Response {
	h := make(http.Header, len(sr.Header)+1)
	for k, v := range sr.Header {
		h[k] = v[:len(v):len(v)]
	}
	h[replayed] = []string{"true"} // h.Set: New made the name canonical
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
