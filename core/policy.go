package core

import (
	"net/http"
	"slices"
	"time"
)

// Policy is the idempotency policy an engine runs with, read back from its
// configuration: what a client must send and what it can rely on. The IETF
// draft (draft-ietf-httpapi-idempotency-key-header) asks every resource to
// publish it, expiry included; package core/openapi renders it for an API
// description (openapi.New(eng.Policy())).
type Policy struct {
	// Header is the request header that carries the key (canonical form).
	Header string
	// ReplayedHeader marks a replayed response, with the value "true"
	// (canonical form; WithReplayedHeader).
	ReplayedHeader string
	// KeyRequired: a protected request without a key is refused (400);
	// otherwise it passes through unprotected.
	KeyRequired bool
	// Methods are the protected methods, sorted. Others bypass idem.
	Methods []string
	// MaxKeyBytes is the longest key accepted, after decoding.
	MaxKeyBytes int
	// Retention is how long a record is kept after its first request; past
	// it, the key is new again.
	Retention time.Duration
	// Lease is how long an owner that stopped heartbeating (a crash) keeps
	// the key before a retry may take it over.
	Lease time.Duration
	// Wait is how long an in-flight duplicate waits for the first request
	// before it is answered 409 (0: at once).
	Wait time.Duration
	// RetryAfter is the Retry-After hint sent with 409 in-flight.
	RetryAfter time.Duration
	// MaxRequestBytes is the largest request body accepted (413 above).
	MaxRequestBytes int64
	// MaxResponseBytes is the largest response body kept for replay.
	MaxResponseBytes int
	// ReplayHeaders are the response headers kept and replayed.
	ReplayHeaders []string
	// FingerprintHeaders are request headers that are part of "the same
	// request", besides the method, route, target and body.
	FingerprintHeaders []string
	// CanonicalJSON: JSON bodies are compared in canonical form (key order
	// and whitespace do not matter).
	CanonicalJSON bool

	retryable func(status int) bool
}

// Policy returns the policy the engine runs with. The slices are the
// caller's own.
func (e *Engine) Policy() Policy {
	methods := make([]string, 0, len(e.cfg.methods))
	for m := range e.cfg.methods {
		methods = append(methods, m)
	}
	slices.Sort(methods)
	fp := make([]string, len(e.cfg.fpHeaders))
	for i, h := range e.cfg.fpHeaders {
		fp[i] = http.CanonicalHeaderKey(h)
	}
	slices.Sort(fp)
	return Policy{
		Header:             e.cfg.header,
		ReplayedHeader:     e.cfg.replayed,
		KeyRequired:        e.cfg.required,
		Methods:            methods,
		MaxKeyBytes:        MaxKeyBytes,
		Retention:          e.cfg.retention,
		Lease:              e.cfg.lease,
		Wait:               e.cfg.wait,
		RetryAfter:         e.cfg.retryAfter,
		MaxRequestBytes:    e.cfg.maxRequest,
		MaxResponseBytes:   e.cfg.maxResponse,
		ReplayHeaders:      slices.Clone(e.cfg.replayHeaders),
		FingerprintHeaders: fp,
		CanonicalJSON:      e.cfg.canonicalJSON,
		retryable:          e.cfg.retryable,
	}
}

// Protects reports whether requests with method are under idem.
func (p Policy) Protects(method string) bool {
	return slices.Contains(p.Methods, method)
}

// Replayed reports whether a response with status is stored and replayed
// to retries (the outcome policy classifies it final), as opposed to
// leaving the key retryable.
func (p Policy) Replayed(status int) bool {
	if p.retryable == nil {
		return !DefaultRetryable(status)
	}
	return !p.retryable(status)
}
