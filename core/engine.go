package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Outcome is what Decide tells the adapter to do.
type Outcome int

const (
	// Bypass: idem does not apply (safe method, or no key where keys are
	// optional). Run the handler as if idem were absent.
	Bypass Outcome = iota
	// Proceed: this request owns the key. Run the handler on Decision.Context,
	// capture its response, then call Commit (or Abort).
	Proceed
	// Replay: write Decision.Response, the stored response of the first
	// request, marked with Idempotent-Replayed: true.
	Replay
	// Reject: write Decision.Response, a problem response (400, 401, 409,
	// 413, 422 or 503). The handler must not run.
	Reject
)

func (o Outcome) String() string {
	switch o {
	case Bypass:
		return "bypass"
	case Proceed:
		return "proceed"
	case Replay:
		return "replay"
	case Reject:
		return "reject"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// ReplayedHeader marks a replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// Errors returned by Commit and Abort besides the store's.
var (
	// ErrNotOwner: Commit or Abort on a decision that is not Proceed.
	ErrNotOwner = errors.New("idem: decision does not own the key")
	// ErrFinished: Commit or Abort called a second time for one decision.
	ErrFinished = errors.New("idem: decision already committed or aborted")
)

// Request is what an adapter hands to Decide.
type Request struct {
	Method string
	// Route is the route template ("/v1/payments/:id"), or the path when the
	// framework has none. It is part of the fingerprint.
	Route string
	// Target is the request target as received, path and query
	// (r.URL.RequestURI()). It is part of the fingerprint, so one key reused
	// on /orders/1/confirm and /orders/2/confirm is refused (422) rather than
	// replayed. Adapters always set it.
	Target string
	// Header holds the request headers: the key header and any headers
	// named by WithFingerprintHeaders are read from it.
	Header http.Header
	// HeaderReader is read instead of Header when Header is nil, for
	// frameworks that keep headers in their own form (fasthttp): the engine
	// asks only for the headers it needs. A ScopeFunc set with WithScope may
	// read any header from Header; for it, the engine fills Header from
	// HeaderReader's Header() http.Header method if it has one.
	HeaderReader HeaderReader
	// Body is read by Decide (up to the request limit) for the fingerprint;
	// the adapter gives the handler Decision.Body instead. May be nil.
	Body io.Reader
	// BodyBytes, when not nil, is the whole body already in memory (fasthttp
	// holds it): Decide hashes it in place instead of reading Body, and keeps
	// no reference to it once it returns, so it may alias the framework's
	// buffer. The framework still gives the handler its body: Decision.Body
	// is then nil and BodyRead false. Over the request limit it is refused
	// (413) as a Body would be.
	BodyBytes []byte
	// Scope is the tenant, when the adapter knows it up front.
	Scope string
	// ScopeFunc, when set, is called instead (only for requests idem
	// protects) to find the tenant; an error answers 401. Adapters set it
	// from their scope option. WithScope replaces both.
	ScopeFunc func(ctx context.Context) (string, error)
}

// Response is a response as written by a handler, or as idem writes it.
type Response struct {
	Status int // 0 means the handler wrote nothing: 200, as net/http does
	Header http.Header
	// HeaderReader is read instead of Header when Header is nil (see
	// Request.HeaderReader): Commit asks it only for the allow-listed
	// headers (WithReplayHeaders).
	HeaderReader HeaderReader
	Body         []byte
	// Streamed: the handler flushed or hijacked; the response went out as it
	// was written and cannot be kept.
	Streamed bool
	// Truncated: the body exceeded the response limit; it went out whole but
	// cannot be kept.
	Truncated bool
}

// HeaderReader reads headers an adapter does not hold as an http.Header,
// by canonical name: every value of the header, in order, nil when absent.
// The strings must not alias memory the framework reuses: the engine and
// the store may keep them. http.Header implements it.
type HeaderReader interface {
	Values(name string) []string
}

// values reads one request header from Header or HeaderReader.
func (r *Request) values(name string) []string {
	if r.Header == nil && r.HeaderReader != nil {
		return r.HeaderReader.Values(name)
	}
	return r.Header.Values(name)
}

// fingerprintHeader returns what the fingerprint reads the headers named
// by WithFingerprintHeaders from: Header, or those headers read from
// HeaderReader.
func (r *Request) fingerprintHeader(names []string) http.Header {
	if len(names) == 0 || r.Header != nil || r.HeaderReader == nil {
		return r.Header
	}
	h := make(http.Header, len(names))
	for _, n := range names {
		n = http.CanonicalHeaderKey(n)
		if v := r.HeaderReader.Values(n); len(v) > 0 {
			h[n] = v
		}
	}
	return h
}

// Engine decides, for every request, whether the handler runs. It is safe
// for concurrent use; build one per store and share it across adapters.
type Engine struct {
	store Store
	cfg   config
	hb    hbQueue
}

// New builds an engine on store. It validates the options and returns an
// error describing every invalid one; it never panics.
func New(store Store, opts ...Option) (*Engine, error) {
	if store == nil {
		return nil, errors.New("idem: store is nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.stepsRequired && !StepsSupported(store) {
		return nil, fmt.Errorf("idem: WithStepsRequired: store %T does not keep steps (core.StepStore)", store)
	}
	cfg.header = http.CanonicalHeaderKey(cfg.header)
	// Canonicalise a copy: the default list is a shared package variable.
	canon := make([]string, len(cfg.replayHeaders))
	for i, h := range cfg.replayHeaders {
		canon[i] = http.CanonicalHeaderKey(h)
	}
	cfg.replayHeaders = canon
	return &Engine{store: store, cfg: cfg}, nil
}

// Store returns the engine's store.
func (e *Engine) Store() Store { return e.store }

// MaxResponseBytes is the largest response body kept for replay; adapters
// size their capture buffers with it.
func (e *Engine) MaxResponseBytes() int { return e.cfg.maxResponse }

// Decision is the result of Decide. For Proceed it holds the lease until
// Commit or Abort, which must be called exactly once.
type Decision struct {
	Outcome Outcome
	// Response is what to write for Replay and Reject. Its header map is
	// the decision's own; for a Replay, the header values and the body are
	// shared with the store and must not be modified in place (an append
	// to a value slice reallocates).
	Response *Response
	// Body is the request body as Decide read it; the adapter hands it to
	// the handler. BodyRead tells whether Decide consumed Request.Body at all.
	Body     []byte
	BodyRead bool
	// Key and Scope of the request ("" on Bypass).
	Key   string
	Scope string

	eng   *Engine
	lease *Lease // &own.lease for Proceed, else nil
	route string
	own   *owner // Proceed only: replays and rejects stay one small allocation
}

// owner is the state of a Proceed decision, allocated once at the claim:
// the lease, the handler's context, the commit context and the heartbeat
// live here rather than in one allocation each.
type owner struct {
	lease  Lease
	lctx   leaseCtx  // the first Context's; later calls allocate their own
	lctxOK bool      // lctx is in use
	cctx   commitCtx // Commit's or Abort's (there is exactly one)

	mu        sync.Mutex
	finished  bool
	lostErr   error
	cancels   []context.CancelCauseFunc
	cancelBuf [1]context.CancelCauseFunc // cancels' first element
	hbCancel  context.CancelFunc         // the renewal in progress, if any
	hbStop    chan struct{}              // made when the renewal loop starts
	hbLoop    sync.WaitGroup             // held from the claim until the loop may no longer start or has returned

	// In the engine's hbQueue until the first renewal is due (guarded by
	// the queue's lock).
	d          *Decision
	prev, next *owner
	queued     bool
	due        time.Time
	hbSince    time.Time // when the claim was sent
}

// Context returns parent carrying the lease (for KeyFromContext, RelayKey
// and stores such as pgstore.Tx), cancelled with a cause wrapping
// ErrLeaseLost if the heartbeat finds the lease gone. For other outcomes it
// returns parent unchanged.
func (d *Decision) Context(parent context.Context) context.Context {
	if d == nil || d.own == nil {
		return parent
	}
	o := d.own
	// One cancelCtx (context.Cause needs the real one) wrapped by a
	// leaseCtx carrying the lease, instead of a value context under it.
	cc, cancel := context.WithCancelCause(parent)
	o.mu.Lock()
	defer o.mu.Unlock()
	lc := &o.lctx
	if o.lctxOK {
		lc = new(leaseCtx)
	}
	o.lctxOK = true
	*lc = leaseCtx{Context: cc, lease: &o.lease}
	switch {
	case o.lostErr != nil:
		cancel(o.lostErr)
	case o.finished:
		cancel(ErrFinished)
	default:
		if o.cancels == nil {
			o.cancels = o.cancelBuf[:0]
		}
		o.cancels = append(o.cancels, cancel)
	}
	return lc
}

// Fence returns the fence of a Proceed decision (zero otherwise).
func (d *Decision) Fence() Fence {
	if d == nil || d.lease == nil {
		return Fence{}
	}
	return d.lease.fence
}

// Decide classifies a request. A non-nil error means a system failure (the
// store could not be reached): the decision is then a Reject carrying a 503
// problem, and the handler must not run. Every other refusal is a Reject
// with a nil error.
func (e *Engine) Decide(ctx context.Context, req Request) (*Decision, error) {
	method := strings.ToUpper(req.Method)
	if !e.cfg.methods[method] {
		return e.bypass(req), nil
	}
	if _, nested := LeaseFromContext(ctx); nested {
		// idem mounted twice (globally and on the route), or a handler
		// serving an internal request on its own context: the execution is
		// already owned; claiming again would only refuse ourselves.
		return e.bypass(req), nil
	}
	key, err := ParseKey(req.values(e.cfg.header))
	if errors.Is(err, ErrKeyMissing) {
		if !e.cfg.required {
			return e.bypass(req), nil
		}
		return e.reject(ctx, "rejected", req.Route, ProblemMissingKey, http.StatusBadRequest,
			"the "+e.cfg.header+" header is required for "+method+" requests"), nil
	}
	if err != nil {
		return e.reject(ctx, "rejected", req.Route, ProblemInvalidKey, http.StatusBadRequest, err.Error()), nil
	}
	scope, err := e.scopeOf(ctx, &req)
	if err != nil {
		return e.reject(ctx, "rejected", req.Route, ProblemScopeUnavailable, http.StatusUnauthorized,
			"the request's tenant could not be determined"), nil
	}

	var (
		body     []byte
		tooLarge bool
	)
	read := req.BodyBytes == nil
	if read {
		body, tooLarge, err = readBody(req.Body, e.cfg.maxRequest)
	} else {
		body, tooLarge = req.BodyBytes, int64(len(req.BodyBytes)) > e.cfg.maxRequest
	}
	if tooLarge || isMaxBytesError(err) { // our limit, or one set outside (http.MaxBytesReader)
		return e.reject(ctx, "rejected", req.Route, ProblemBodyTooLarge, http.StatusRequestEntityTooLarge,
			"the request body exceeds "+strconv.FormatInt(e.cfg.maxRequest, 10)+" bytes"), nil
	}
	if err != nil {
		// The client went away or sent a broken body; nothing was claimed.
		return e.reject(ctx, "rejected", req.Route, ProblemBodyUnreadable, http.StatusBadRequest, "the request body could not be read"), nil
	}

	claim := ClaimRequest{
		Scope:  scope,
		Key:    key,
		Method: method,
		Route:  req.Route,
		Fingerprint: Fingerprint(FingerprintInput{
			Method: method, Route: req.Route, Target: req.Target, Body: body,
			Header: req.fingerprintHeader(e.cfg.fpHeaders), Headers: e.cfg.fpHeaders, CanonicalJSON: e.cfg.canonicalJSON,
		}),
		Lease:     e.cfg.lease,
		Retention: e.cfg.retention,
	}
	d := &Decision{Key: key, Scope: scope, BodyRead: read, eng: e, route: req.Route}
	if read {
		d.Body = body
	}

	var deadline time.Time
	if e.cfg.wait > 0 {
		deadline = e.cfg.now().Add(e.cfg.wait)
	}
	poll := e.cfg.waitPoll
	watcher, _ := e.store.(Watcher)
	var changed <-chan struct{}
	unwatch := func() {}
	defer func() { unwatch() }()
	arm := func() {
		changed, unwatch = watcher.Watch(ctx, scope, key)
		if unwatch == nil {
			unwatch = func() {}
		}
		if changed == nil { // a Watcher that cannot watch: poll instead
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
			e.observe(Event{Kind: "canceled", Scope: scope, Route: req.Route, Duration: took, Err: err})
			e.log(ctx, slog.LevelInfo, "canceled", key, scope, req.Route, slog.Any("err", err))
			d.Outcome = Reject
			d.Response = ProblemResponse(e.cfg.problemBaseURI, ProblemStoreUnavailable, http.StatusServiceUnavailable,
				"the request was cancelled before it was processed")
			return d, nil
		}
		if err != nil {
			err = fmt.Errorf("idem: claim: %w", err)
			e.observe(Event{Kind: "store_error", Scope: scope, Route: req.Route, Status: http.StatusServiceUnavailable, Duration: took, Err: err})
			e.log(ctx, slog.LevelError, "store_error", key, scope, req.Route, slog.Any("err", err))
			d.Outcome = Reject
			d.Response = ProblemResponse(e.cfg.problemBaseURI, ProblemStoreUnavailable, http.StatusServiceUnavailable,
				"the idempotency store could not be reached; the request was not processed")
			d.Response.Header.Set("Retry-After", "1")
			return d, err
		}
		if res.Claimed {
			d.Outcome = Proceed
			d.own = &owner{lease: Lease{fence: Fence{Scope: scope, Key: key, Token: res.Record.Token}, store: e.store, fresh: res.Fresh}}
			d.lease = &d.own.lease
			d.startHeartbeat(sent)
			e.observe(Event{Kind: "claim", Scope: scope, Route: req.Route, Duration: took})
			e.log(ctx, slog.LevelInfo, "claim", key, scope, req.Route, slog.Int64("token", res.Record.Token))
			return d, nil
		}
		rec := res.Record
		if rec.Method != method || rec.Route != req.Route || rec.Fingerprint != claim.Fingerprint {
			e.observe(Event{Kind: "mismatch", Scope: scope, Route: req.Route, Status: http.StatusUnprocessableEntity, Duration: took})
			e.log(ctx, slog.LevelWarn, "mismatch", key, scope, req.Route)
			d.Outcome = Reject
			d.Response = ProblemResponse(e.cfg.problemBaseURI, ProblemPayloadMismatch, http.StatusUnprocessableEntity,
				"this idempotency key was already used with a different request; use a new key for a new request")
			return d, nil
		}
		if rec.Status == StatusCompleted && rec.Response != nil {
			if rec.Response.NotRetained {
				e.observe(Event{Kind: "not_retained", Scope: scope, Route: req.Route, Status: http.StatusConflict, Duration: took})
				e.log(ctx, slog.LevelInfo, "not_retained", key, scope, req.Route)
				d.Outcome = Reject
				d.Response = ProblemResponse(e.cfg.problemBaseURI, ProblemNotRetained, http.StatusConflict,
					"the request with this key completed with status "+strconv.Itoa(rec.Response.Status)+
						" but its response was too large or streamed to keep; it will not be run again")
				return d, nil
			}
			d.Outcome = Replay
			d.Response = replayResponse(rec.Response)
			e.observe(Event{Kind: "replay", Scope: scope, Route: req.Route, Status: d.Response.Status, Duration: took})
			e.log(ctx, slog.LevelInfo, "replay", key, scope, req.Route, slog.Int("status", d.Response.Status))
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
		e.observe(Event{Kind: "conflict", Scope: scope, Route: req.Route, Status: http.StatusConflict, Duration: took})
		e.log(ctx, slog.LevelInfo, "conflict", key, scope, req.Route)
		d.Outcome = Reject
		d.Response = ProblemResponse(e.cfg.problemBaseURI, ProblemInFlight, http.StatusConflict,
			"a request with this idempotency key is still being processed; retry after the indicated delay")
		d.Response.Header.Set("Retry-After", strconv.FormatInt(retry, 10))
		return d, nil
	}
}

// scopeOf finds the request's tenant. The default (WithScope not set) is
// requestScope, called directly so that req does not escape to the heap; a
// custom ScopeFunc gets a heap copy, and what it changes in it is kept.
func (e *Engine) scopeOf(ctx context.Context, req *Request) (string, error) {
	if e.cfg.defaultScope {
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

func (e *Engine) bypass(req Request) *Decision {
	e.observe(Event{Kind: "bypass", Route: req.Route})
	return &Decision{Outcome: Bypass, eng: e}
}

func (e *Engine) reject(ctx context.Context, kind, route, problem string, status int, detail string) *Decision {
	e.observe(Event{Kind: kind, Route: route, Status: status})
	e.log(ctx, slog.LevelInfo, kind, "", "", route, slog.String("problem", problem), slog.Int("status", status))
	return &Decision{Outcome: Reject, eng: e, Response: ProblemResponse(e.cfg.problemBaseURI, problem, status, detail)}
}

// replayResponse marks the stored response replayed. The stored response
// is the store's and read-only (see Store): the replay gets a header map of
// its own, whose value slices are the store's, capped so that an append
// reallocates; the body is shared and only read.
func replayResponse(sr *StoredResponse) *Response {
	h := make(http.Header, len(sr.Header)+1)
	for k, v := range sr.Header {
		h[k] = v[:len(v):len(v)]
	}
	h[ReplayedHeader] = []string{"true"} // h.Set: ReplayedHeader is canonical
	return &Response{Status: sr.Status, Header: h, Body: sr.Body}
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

// Commit records the handler's response for the decision's key: final
// responses are stored for replay, retryable ones (see WithOutcomePolicy)
// mark the key failed so it may be retried. The write is fenced by the lease
// token: a stale owner gets an error wrapping ErrLeaseLost and changes
// nothing. Commit runs on a context detached from ctx's cancellation, bounded
// by the commit timeout, so a client disconnect cannot strand a key.
//
// A response with Status 0 and no body (the handler wrote nothing) while ctx
// is done (the client went away) is treated as Abort.
//
// When Commit fails, the response is not known to be durable: adapters
// answer with CommitErrorResponse instead of the handler's response.
func (e *Engine) Commit(ctx context.Context, d *Decision, resp Response) error {
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
	kind := "commit"
	switch {
	case resp.Status == 0 && len(resp.Body) == 0 && ctx != nil && ctx.Err() != nil:
		// The client went away and the handler gave up without answering:
		// that is no result to replay. Release the key.
		kind = "abort"
		err = e.store.Fail(cctx, d.lease.fence)
	case e.cfg.policy(status) == Retryable:
		kind = "fail"
		err = e.store.Fail(cctx, d.lease.fence)
	case resp.Streamed || resp.Truncated:
		err = e.store.Complete(cctx, d.lease.fence, StoredResponse{Status: status, NotRetained: true})
	default:
		body := resp.Body
		if body == nil {
			body = []byte{}
		}
		err = e.store.Complete(cctx, d.lease.fence, StoredResponse{Status: status, Header: e.keptHeaders(&resp), Body: body})
	}
	return e.finished(ctx, d, kind, status, e.took(start), err)
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
		e.log(ctx, slog.LevelWarn, "abort_cause", d.Key, d.Scope, d.route, slog.Any("cause", cause))
	}
	return e.finished(ctx, d, "abort", 0, e.took(start), err)
}

// CommitErrorResponse is what an adapter writes instead of the handler's
// response when Commit or Abort failed: the outcome is not known to be
// recorded, so the client must not take it as final. A lost lease answers
// 409 (another request owns the key now); anything else 503. Both invite a
// retry, which the record then resolves.
func (e *Engine) CommitErrorResponse(err error) *Response {
	if errors.Is(err, ErrLeaseLost) {
		r := ProblemResponse(e.cfg.problemBaseURI, ProblemInFlight, http.StatusConflict,
			"this request lost ownership of its idempotency key to a retry; retry to get the recorded result")
		r.Header.Set("Retry-After", "1")
		return r
	}
	r := ProblemResponse(e.cfg.problemBaseURI, ProblemStoreUnavailable, http.StatusServiceUnavailable,
		"the result of this request could not be recorded; retry with the same key")
	r.Header.Set("Retry-After", "1")
	return r
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

func (e *Engine) finished(ctx context.Context, d *Decision, kind string, status int, took time.Duration, err error) error {
	d.release()
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			kind = "lease_lost"
		}
		err = fmt.Errorf("idem: %s: %w", kind, err)
		e.observe(Event{Kind: kind, Scope: d.Scope, Route: d.route, Status: status, Duration: took, Err: err})
		e.log(ctx, slog.LevelError, kind, d.Key, d.Scope, d.route, slog.Any("err", err))
		return err
	}
	e.observe(Event{Kind: kind, Scope: d.Scope, Route: d.route, Status: status, Duration: took})
	e.log(ctx, slog.LevelInfo, kind, d.Key, d.Scope, d.route, slog.Int("status", status))
	return nil
}

// finish marks the decision finished and stops its heartbeat.
func (d *Decision) finish(e *Engine) error {
	if d == nil || d.Outcome != Proceed || d.own == nil || d.eng != e {
		return ErrNotOwner
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

// startHeartbeat renews the lease every lease/3 until finish. since is
// when the claim was sent: the store's lease runs from no earlier than that,
// and likewise from each renewal's sending, not from its reply. If no renewal
// succeeded for a whole lease, another instance may own the key: the handler
// is stopped then, at the latest, even while a renewal is still pending.
func (d *Decision) startHeartbeat(since time.Time) {
	o := d.own
	o.d = d
	o.hbSince = since
	o.hbLoop.Add(1)
	d.eng.hb.add(o, d.eng.cfg.lease/3)
}

// hbQueue holds the claims whose first renewal is not due yet, in the
// order it falls due (every claim waits the same lease/3), under one timer
// per engine. Most handlers finish well within lease/3: a short request
// then costs a list insertion and removal, not a runtime timer of its own;
// the renewal loop (a goroutine, a ticker, a timer and its stop channel)
// starts only when the first renewal is due.
type hbQueue struct {
	mu         sync.Mutex
	head, tail *owner
	timer      *time.Timer // fires at head's due time while armed
	armed      bool
}

func (q *hbQueue) add(o *owner, wait time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o.due = time.Now().Add(wait) // under the lock: the list stays in due order
	o.queued = true
	o.prev, o.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = o
	} else {
		q.head = o
	}
	q.tail = o
	if q.armed {
		return // armed for an earlier due time
	}
	q.armed = true
	if q.timer == nil {
		q.timer = time.AfterFunc(wait, q.fire)
	} else {
		q.timer.Reset(wait)
	}
}

// remove takes o off the queue and reports whether it was there, that is
// whether its renewal loop has not been started.
func (q *hbQueue) remove(o *owner) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !o.queued {
		return false
	}
	q.unlinkLocked(o)
	return true
}

func (q *hbQueue) unlinkLocked(o *owner) {
	if o.prev != nil {
		o.prev.next = o.next
	} else {
		q.head = o.next
	}
	if o.next != nil {
		o.next.prev = o.prev
	} else {
		q.tail = o.prev
	}
	o.prev, o.next, o.queued = nil, nil, false
}

// fire starts the renewal loop of every claim that is due and re-arms the
// timer for the next one.
func (q *hbQueue) fire() {
	q.mu.Lock()
	now := time.Now()
	var due []*owner
	for q.head != nil && !q.head.due.After(now) {
		o := q.head
		q.unlinkLocked(o)
		due = append(due, o)
	}
	if q.head != nil {
		q.timer.Reset(q.head.due.Sub(now))
	} else {
		q.armed = false
	}
	q.mu.Unlock()
	for _, o := range due {
		go o.d.heartbeatLoop()
	}
}

// heartbeatLoop runs on its own goroutine, from when the first renewal is
// due until finish.
func (d *Decision) heartbeatLoop() {
	o := d.own
	defer o.hbLoop.Done()
	o.mu.Lock()
	if o.finished { // finish came first (hbQueue.remove lost the race): nothing to do
		o.mu.Unlock()
		return
	}
	o.hbStop = make(chan struct{})
	stop := o.hbStop
	o.mu.Unlock()
	e := d.eng
	lease := e.cfg.lease
	interval := lease / 3
	t := time.NewTicker(interval)
	defer t.Stop()
	lastOK := o.hbSince
	expiry := time.NewTimer(lease - e.cfg.now().Sub(lastOK))
	defer expiry.Stop()
	for due := true; ; due = false { // the first renewal is due as the loop starts
		if !due {
			select {
			case <-stop:
				return
			case <-expiry.C:
				if left := lease - e.cfg.now().Sub(lastOK); left > 0 {
					expiry.Reset(left)
					continue
				}
				d.loseLease(fmt.Errorf("idem: heartbeat: no renewal succeeded for a whole lease (%v): %w", lease, ErrLeaseLost))
				return
			case <-t.C:
			}
		}
		sent := e.cfg.now()
		// A renewal still pending when the lease runs out is too late.
		timeout := min(interval, lease-sent.Sub(lastOK))
		ctx, cancel := context.WithTimeout(ContextWithLease(context.Background(), d.lease), timeout)
		o.mu.Lock()
		if o.finished { // Commit or Abort began: no more renewals
			o.mu.Unlock()
			cancel()
			return
		}
		o.hbCancel = cancel
		o.mu.Unlock()
		err := e.store.Heartbeat(ctx, d.lease.fence, lease)
		o.mu.Lock()
		o.hbCancel = nil
		stopped := o.finished
		o.mu.Unlock()
		cancel()
		if stopped {
			return
		}
		if err == nil {
			lastOK = sent
			expiry.Reset(lease - e.cfg.now().Sub(lastOK))
			continue
		}
		e.observe(Event{Kind: "heartbeat_error", Scope: d.Scope, Route: d.route, Err: err})
		e.log(context.Background(), slog.LevelWarn, "heartbeat_error", d.Key, d.Scope, d.route, slog.Any("err", err))
		switch {
		case errors.Is(err, ErrLeaseLost):
			d.loseLease(fmt.Errorf("idem: heartbeat: %w", err))
			return
		case e.cfg.now().Sub(lastOK) >= lease:
			// A whole lease without a successful heartbeat: another
			// instance may own the key now. Stop the handler.
			d.loseLease(fmt.Errorf("idem: heartbeat failed for a whole lease (%v): %w", err, ErrLeaseLost))
			return
		}
	}
}

func (d *Decision) loseLease(cause error) {
	o := d.own
	o.mu.Lock()
	o.lostErr = cause
	cancels := o.cancels
	o.cancels = nil
	o.mu.Unlock()
	for _, c := range cancels {
		c(cause)
	}
}

// keptHeaders returns the allow-listed headers of resp, from Header or,
// when it is nil, from HeaderReader.
func (e *Engine) keptHeaders(resp *Response) http.Header {
	if resp.Header != nil || resp.HeaderReader == nil {
		return e.filterHeaders(resp.Header)
	}
	var out http.Header
	for _, name := range e.cfg.replayHeaders {
		if v := resp.HeaderReader.Values(name); len(v) > 0 {
			if out == nil {
				out = make(http.Header, 2)
			}
			out[name] = v[:len(v):len(v)] // capped: an append elsewhere reallocates
		}
	}
	if out == nil {
		out = http.Header{}
	}
	return out
}

// filterHeaders keeps the allow-listed headers of h, under their canonical
// names. Keys a handler put in the map directly (h["content-type"]) reach
// the client as written, so they count too; canonical keys come first.
func (e *Engine) filterHeaders(h http.Header) http.Header {
	n := 0
	for _, name := range e.cfg.replayHeaders {
		n += len(h[name])
	}
	// One backing array for the values kept under canonical names; each
	// key's slice is capped, so appending the odd keys below reallocates.
	vals := make([]string, 0, n)
	out := make(http.Header, min(len(h), len(e.cfg.replayHeaders)))
	for _, name := range e.cfg.replayHeaders {
		if v, ok := h[name]; ok && len(v) > 0 {
			i := len(vals)
			vals = append(vals, v...)
			out[name] = vals[i:len(vals):len(vals)]
		}
	}
	var odd []string
	for k := range h {
		if len(h[k]) > 0 && http.CanonicalHeaderKey(k) != k {
			odd = append(odd, k)
		}
	}
	sort.Strings(odd)
	for _, k := range odd {
		name := http.CanonicalHeaderKey(k)
		if slices.Contains(e.cfg.replayHeaders, name) {
			out[name] = append(out[name], h[k]...)
		}
	}
	return out
}

// timing starts timing a store call for the observer's Event.Duration: the
// clock is read only when there is an observer (a clock read is a visible
// share of a replay's CPU on some VMs).
func (e *Engine) timing() time.Time {
	if e.cfg.observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// since is time.Since(start) for a start from timing, 0 without one.
func since(start time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	return time.Since(start)
}

// took is the observer's duration of a commit that started at start.
func (e *Engine) took(start time.Time) time.Duration {
	if e.cfg.observer == nil {
		return 0
	}
	return time.Since(start)
}

func (e *Engine) observe(ev Event) {
	if e.cfg.observer != nil {
		e.cfg.observer(ev)
	}
}

func (e *Engine) log(ctx context.Context, level slog.Level, msg, key, scope, route string, attrs ...slog.Attr) {
	if !e.cfg.logger.Enabled(ctx, level) {
		return
	}
	base := make([]slog.Attr, 0, 4+len(attrs))
	if key != "" {
		base = append(base, slog.String("key", e.redact(key)))
	}
	if scope != "" {
		base = append(base, slog.String("scope", scope))
	}
	if route != "" {
		base = append(base, slog.String("route", route))
	}
	base = append(base, attrs...)
	e.cfg.logger.LogAttrs(ctx, level, "idem: "+msg, base...)
}

// redact hides a key behind a short hash: enough to correlate log lines,
// useless to replay the request.
func (e *Engine) redact(key string) string {
	if e.cfg.logKeys {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:6])
}
