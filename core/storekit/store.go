package storekit

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// Status is the state of an idempotency record.
type Status string

// The record states. A record is created processing; its owner moves it to
// completed (final response stored) or failed (the key may be retried).
const (
	StatusProcessing Status = "processing"
	StatusCompleted  Status = "completed"
	StatusFailed     Status = "failed"
)

// Errors a Store returns. Stores wrap them with context; callers test with errors.Is.
var (
	// ErrLeaseLost means the caller's lease token no longer owns the record:
	// another owner took it over (or the record is no longer processing).
	// Nothing was changed.
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrNotFound means no record exists for (scope, key).
	ErrNotFound = errors.New("idem: record not found")
	// ErrNotCommitted means Complete did not record the response because
	// the handler's writes did not commit: the handler ended the store's
	// transaction itself, or the database refused a write queued to commit
	// with the response (pgstore.Defer and its counterparts). The response would describe writes
	// that never landed. The store released the key (a retry runs the
	// handler again); the engine answers 500 (handler-error), not the
	// handler's response.
	ErrNotCommitted = errors.New("idem: the handler's writes did not commit")
)

// Fence identifies one ownership of one record: the (scope, key) pair and
// the lease token handed out by the claim. Every write an owner makes is
// conditional on the token still being current.
type Fence struct {
	Scope string
	Key   string
	Token int64
}

// StoredResponse is a response as kept for replay.
type StoredResponse struct {
	Status int
	// Header holds only allow-listed headers (see core.WithReplayHeaders).
	Header http.Header
	// Body is the response body. A nil body and an empty body are both
	// replayed as an empty body.
	Body []byte
	// NotRetained is set when the request completed but its response could
	// not be kept (too large, or streamed). A retry is answered with a
	// not-retained problem instead of re-running the handler.
	NotRetained bool
}

// Record is one idempotency record as a Store holds it.
type Record struct {
	Scope       string
	Key         string
	Method      string
	Route       string
	Fingerprint string // hex SHA-256 of the request's identity, computed by the engine; opaque to stores
	Status      Status
	// Token is the lease token of the current (or last) owner. Tokens are
	// strictly increasing per store: a takeover always yields a larger one,
	// and a token is never handed out twice, even after the record was
	// deleted and created again.
	Token       int64
	LockedUntil time.Time
	// Response is set only when Status is StatusCompleted.
	Response  *StoredResponse
	CreatedAt time.Time
	ExpiresAt time.Time
}

// ClaimRequest asks a Store to claim (scope, key) or report what holds it.
type ClaimRequest struct {
	Scope       string
	Key         string
	Method      string
	Route       string
	Fingerprint string
	// Lease is how long the claim lasts without a heartbeat:
	// locked_until = store now + Lease.
	Lease time.Duration
	// Retention is how long the record is kept: expires_at = store now + Retention.
	Retention time.Duration
}

// ClaimResult is the outcome of Store.Claim.
type ClaimResult struct {
	// Claimed reports that the caller now owns the execution under Record.Token.
	Claimed bool
	// Record is the record as it stands after the call: the fresh processing
	// record when Claimed, the existing one unchanged otherwise.
	Record Record
	// Now is the store's clock at the time of the claim. Durations such as
	// Retry-After are computed against it, never against the caller's clock.
	Now time.Time
	// Fresh may be set with Claimed when the claim created the record (a
	// new key, or one new again after retention): it then has no steps
	// (StepStore), and the first Step of the execution skips reading them.
	// It must be false for a takeover. A store may always leave it false;
	// that costs one read at the first Step of each execution.
	Fresh bool
}

// Store is where idempotency records live. Implementations must make Claim
// atomic across every process sharing the store; core/storetest holds the
// conformance suite each one must pass. core.Store is this interface.
//
// Every method takes the context first; a cancelled context returns an error
// wrapping ctx.Err() and changes nothing.
//
// Records returned by Claim and Get are read-only for the caller: they may
// share memory (the response's header map and slices, its body) with the
// store and with other callers. A store never modifies a response once it
// has handed it out; a later Complete, takeover or expiry replaces it.
// Callers copy what they need to change (the engine builds each replay's
// headers anew).
//
// Further rules the conformance suite pins: a fenced write (Heartbeat,
// Complete, Fail) to a missing record returns ErrLeaseLost; a takeover
// recomputes LockedUntil and ExpiresAt from the new request; retention counts
// from the claim (the engine requires Retention > Lease, and by default they
// differ by a factor of 2880). Whether a fenced write succeeds on a record
// that is past ExpiresAt with a lapsed lease, before anyone replaced it, is
// store-specific: either answer is safe, since no one else owns it.
type Store interface {
	// Claim atomically does exactly one of:
	//   - insert a new processing record (no record, or the existing one is past
	//     ExpiresAt and not held by a live lease: the key is new again);
	//   - take over an existing record whose Method, Route and Fingerprint all
	//     match the request and which is failed, or processing with LockedUntil
	//     in the past: status becomes processing with a new, larger token;
	//   - return the existing record unchanged with Claimed false.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// Heartbeat extends LockedUntil to store now + extend if f still owns the
	// processing record; otherwise it returns ErrLeaseLost.
	Heartbeat(ctx context.Context, f Fence, extend time.Duration) error

	// Complete stores resp and marks the record completed, only if f still
	// owns the processing record; otherwise ErrLeaseLost and nothing changes.
	// The caller may reuse resp's slices and maps after Complete returns:
	// a store keeps copies, never references.
	Complete(ctx context.Context, f Fence, resp StoredResponse) error

	// Fail marks the record failed (retryable by a request with the same
	// fingerprint), only if f still owns the processing record; otherwise
	// ErrLeaseLost and nothing changes.
	Fail(ctx context.Context, f Fence) error

	// Get returns the record for (scope, key) or ErrNotFound. An expired
	// record may still be returned; callers compare ExpiresAt themselves.
	Get(ctx context.Context, scope, key string) (Record, error)
}

// Watcher is an optional Store capability: it wakes a duplicate that waits
// for an in-flight owner (core.WithWait) as soon as the record changes, instead of
// at its next poll. Stores without it are polled.
type Watcher interface {
	// Watch returns a channel that is closed when the record (scope, key)
	// may have changed after the call, and a function that releases the
	// watch. Spurious wake-ups are allowed; missed ones are not.
	Watch(ctx context.Context, scope, key string) (<-chan struct{}, func())
}

// As finds the store of type T in s or behind the decorators wrapping
// it (metrics, tracing: a decorator exposes the store it wraps with an
// Unwrap() Store method, as otelidem's does). Stores use it to find
// themselves behind such wrappers, and the engine to find optional
// capabilities. The chain is followed at most 8 deep, so a decorator cycle
// cannot hang a request.
func As[T any](s Store) (T, bool) {
	for range 8 {
		if v, ok := s.(T); ok {
			return v, true
		}
		u, ok := s.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		s = u.Unwrap()
	}
	var zero T
	return zero, false
}

// CallMethod is the method recorded for the records of core.Engine.Call,
// so that idemctl, logs and telemetry tell them from HTTP requests; their
// route is the call's name.
const CallMethod = "CALL"
