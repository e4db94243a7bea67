package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Option configures an Engine. Options follow the OpenTelemetry-contrib
// style: a nil Option is ignored.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// DefaultRetryable is the default outcome policy (WithRetryable): 408,
// 409, 425 and 429, which tell the client to try again, and every status
// outside 2xx–4xx are retryable; the rest is final, stored and replayed.
func DefaultRetryable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status < 200 || status >= 500
}

// defaultReplayHeaders is WithReplayHeaders' default, shared by every
// engine's default config: New canonicalises a copy.
var defaultReplayHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Location", "Content-Disposition", "Vary",
	"Location", "ETag", "Last-Modified", "Link", "Preference-Applied",
}

// neverReplayed are headers that must not be stored: per-response, per-client
// or per-connection. Listing one in WithReplayHeaders is a configuration error.
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Date": true, "Content-Length": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Authorization": true, "Www-Authenticate": true, "Idempotent-Replayed": true,
}

// ScopeFunc returns the tenant a request belongs to. Records are keyed by
// (scope, key): two tenants sending the same key never share a record.
type ScopeFunc func(ctx context.Context, r *Request) (string, error)

type config struct {
	header         string
	required       bool
	methods        map[string]bool
	lease          time.Duration
	retention      time.Duration
	maxRequest     int64
	maxResponse    int
	retryable      func(status int) bool
	replayHeaders  []string
	replayed       string // WithReplayedHeader
	fpHeaders      []string
	canonicalJSON  bool
	scope          ScopeFunc
	defaultScope   bool // scope is requestScope: Decide calls it directly
	sharedKeySpace bool // WithSharedKeySpace: a request without a scope uses ""
	wait           time.Duration
	waitPoll       time.Duration
	now            func() time.Time
	logger         *slog.Logger
	observer       func(Event)
	commitTimeout  time.Duration
	stepsRequired  bool // step.go
	retryAfter     time.Duration
}

func defaultConfig() config {
	return config{
		header:        "Idempotency-Key",
		required:      true,
		methods:       map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		lease:         30 * time.Second,
		retention:     24 * time.Hour,
		maxRequest:    1 << 20,
		maxResponse:   1 << 20,
		retryable:     DefaultRetryable,
		replayHeaders: defaultReplayHeaders,
		replayed:      ReplayedHeader,
		scope:         requestScope,
		defaultScope:  true,
		waitPoll:      20 * time.Millisecond,
		now:           time.Now,
		logger:        slog.New(slog.DiscardHandler),
		commitTimeout: 5 * time.Second,
		retryAfter:    time.Second,
	}
}

// WithHeader sets the request header that carries the key.
// Default: "Idempotency-Key".
func WithHeader(name string) Option {
	return optionFunc(func(c *config) { c.header = name })
}

// WithKeyRequired sets whether a protected request without a key is refused
// with 400 (true) or passed through unprotected (false). Default: true.
func WithKeyRequired(required bool) Option {
	return optionFunc(func(c *config) { c.required = required })
}

// WithMethods sets the HTTP methods idem protects; others bypass it. Safe
// methods (GET, HEAD, OPTIONS, TRACE) are refused by New.
// Default: POST, PATCH.
func WithMethods(methods ...string) Option {
	return optionFunc(func(c *config) {
		c.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			c.methods[strings.ToUpper(m)] = true
		}
	})
}

// WithLease sets how long a claim lasts without a heartbeat. The engine
// heartbeats every lease/3 while the handler runs, so only a dead owner's
// lease lapses; a shorter lease means a faster takeover after a crash.
// When a heartbeat finds the lease gone, or none succeeds for a whole
// lease, the handler's context is cancelled with ErrLeaseLost; if the handler
// then answers nothing, the key is released and the client gets 409
// (in-flight) to retry.
// Default: 30s. Minimum: 100ms.
func WithLease(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lease = d })
}

// WithRetention sets how long a record is kept; after it the key is new
// again. Default: 24h. Must exceed the lease.
func WithRetention(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retention = d })
}

// WithMaxRequestBytes sets the largest request body idem reads to
// fingerprint; larger requests get 413 and the handler does not run.
// Default: 1 MiB.
func WithMaxRequestBytes(n int64) Option {
	return optionFunc(func(c *config) { c.maxRequest = n })
}

// WithMaxResponseBytes sets the largest response body kept for replay. A
// larger response is still delivered, and its key completes as "not
// retained": a retry gets a problem response, never a second execution.
// Default: 1 MiB.
func WithMaxResponseBytes(n int) Option {
	return optionFunc(func(c *config) { c.maxResponse = n })
}

// WithRetryable sets which response statuses are retryable: not stored,
// the record is released and a retry with the same request runs the
// handler again. Every other status is final: stored and replayed to every
// retry. Default: DefaultRetryable.
func WithRetryable(retryable func(status int) bool) Option {
	return optionFunc(func(c *config) { c.retryable = retryable })
}

// WithReplayHeaders replaces the response header allow-list kept for replay.
// Set-Cookie, Date, Authorization-related and hop-by-hop headers are refused
// by New. Default: Content-Type, Content-Encoding, Content-Language,
// Content-Location, Content-Disposition, Vary, Location, ETag,
// Last-Modified, Link and Preference-Applied (Policy.ReplayHeaders).
func WithReplayHeaders(names ...string) Option {
	return optionFunc(func(c *config) { c.replayHeaders = append([]string(nil), names...) })
}

// WithFingerprintHeaders adds request headers to the fingerprint (for
// example "Accept" when it changes the response). Default: none.
func WithFingerprintHeaders(names ...string) Option {
	return optionFunc(func(c *config) { c.fpHeaders = append([]string(nil), names...) })
}

// WithCanonicalJSON fingerprints JSON bodies in canonical form, so a retry
// that re-encodes the same JSON (other key order or whitespace) matches.
// Bodies that are not valid JSON are fingerprinted as raw bytes.
// Default: false.
func WithCanonicalJSON(on bool) Option {
	return optionFunc(func(c *config) { c.canonicalJSON = on })
}

// WithScope sets the function giving a request's tenant. An error refuses the
// request with 401 and runs nothing (the error is logged and reported in the
// observer's event). Records are keyed by (scope, key), so two tenants
// sending the same key never share a record.
//
// Default: the adapter's scope option (it sets Request.ScopeFunc), else
// Request.Scope. A request that has neither, or whose scope function
// answers ("", nil), is refused with 401 (ErrNoScope; nothing is claimed,
// the handler does not run) unless WithSharedKeySpace is set: idem fails
// closed on tenancy. A nil f is an error from New.
func WithScope(f ScopeFunc) Option {
	return optionFunc(func(c *config) { c.scope, c.defaultScope = f, false })
}

// WithReplayedHeader names the header that marks a replayed response
// (value "true"), for clients that expect another name than Stripe's:
// the IETF draft's conformance suites and several peers send
// Idempotency-Replayed, others X-Idempotent-Replay. Every adapter and the
// published policy (Policy, core/openapi) use it; it is never stored or
// replayed from a handler's response.
//
// Default: ReplayedHeader ("Idempotent-Replayed"). A name that is not a
// header token, or is the key header, is an error from New.
func WithReplayedHeader(name string) Option {
	return optionFunc(func(c *config) { c.replayed = name })
}

// WithSharedKeySpace puts every request that names no tenant (no scope
// function, or one answering "") into one key space shared by all clients
// (scope ""). The risk: client B sending client
// A's key with the same request gets A's stored response, and keys are often
// guessable (order ids, timestamps). Use it only when one process serves one
// client (a single-tenant service, a job runner, a demo), or when the key
// itself is a server-issued secret. Default: off (a request with no scope is
// refused with 401, and adapters refuse to be built without a scope option).
func WithSharedKeySpace() Option {
	return optionFunc(func(c *config) { c.sharedKeySpace = true })
}

// WithWait makes a duplicate that arrives while the first request is in
// flight wait up to d for it to finish and replay its response, instead of
// getting 409 at once. It falls back to 409 after d. Default: 0 (409 at once).
func WithWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.wait = d })
}

// WithWaitPoll sets the first interval at which a waiting duplicate polls the
// store; it doubles up to 10x this value. Default: 20ms.
func WithWaitPoll(d time.Duration) Option {
	return optionFunc(func(c *config) { c.waitPoll = d })
}

// WithLogger sets the logger for decisions and failures. Keys are logged as
// a short hash (RedactKey), never in clear. Default: no logging.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithObserver sets a hook called synchronously for every decision and
// commit, for metrics. It must be fast and must not panic. Default: none.
func WithObserver(f func(Event)) Option {
	return optionFunc(func(c *config) { c.observer = f })
}

// WithCommitTimeout bounds Commit and Abort, which run on a context detached
// from the request so a client disconnect cannot strand a key.
// Default: 5s.
func WithCommitTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.commitTimeout = d })
}

// WithRetryAfter sets the Retry-After hint sent with 409 in-flight, in whole
// seconds; it never exceeds the time left on the owner's lease.
// Default: 1s.
func WithRetryAfter(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retryAfter = d })
}

func (c *config) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.header == "" || !validHeaderName(c.header) {
		bad("header name %q is not a valid HTTP field name", c.header)
	}
	if len(c.methods) == 0 {
		bad("at least one method must be protected")
	}
	for m := range c.methods {
		switch m {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
			bad("method %s is safe and cannot be protected", m)
		case "":
			bad("empty method name")
		}
	}
	if c.lease < 100*time.Millisecond {
		bad("lease %v is shorter than 100ms", c.lease)
	}
	if c.retention <= c.lease {
		bad("retention %v must exceed the lease %v", c.retention, c.lease)
	}
	if c.maxRequest <= 0 {
		bad("max request bytes must be positive, got %d", c.maxRequest)
	}
	if c.maxResponse < 0 {
		bad("max response bytes must not be negative, got %d", c.maxResponse)
	}
	if c.retryable == nil {
		bad("outcome policy is nil")
	}
	if c.scope == nil {
		bad("scope function is nil")
	}
	if c.replayed == "" || !validHeaderName(c.replayed) {
		bad("replayed header %q is not a header name", c.replayed)
	} else if http.CanonicalHeaderKey(c.replayed) == http.CanonicalHeaderKey(c.header) {
		bad("replayed header %s is the key header", c.replayed)
	}
	for _, h := range c.replayHeaders {
		if k := http.CanonicalHeaderKey(h); neverReplayed[k] || k == http.CanonicalHeaderKey(c.replayed) {
			bad("header %s must never be replayed", h)
		}
	}
	if c.wait < 0 {
		bad("wait %v is negative", c.wait)
	}
	if c.waitPoll <= 0 {
		bad("wait poll interval must be positive, got %v", c.waitPoll)
	}
	if c.now == nil {
		bad("clock is nil")
	}
	if c.logger == nil {
		bad("logger is nil")
	}
	if c.commitTimeout <= 0 {
		bad("commit timeout must be positive, got %v", c.commitTimeout)
	}
	if c.retryAfter < time.Second {
		bad("retry-after hint %v is shorter than 1s", c.retryAfter)
	}
	if len(errs) > 0 {
		return fmt.Errorf("idem: invalid options: %w", errors.Join(errs...))
	}
	return nil
}

func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func requestScope(ctx context.Context, r *Request) (string, error) {
	if r.ScopeFunc != nil {
		return r.ScopeFunc(ctx, r)
	}
	return r.Scope, nil
}
