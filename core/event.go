package core

import (
	"time"
)

// The kinds of Event, one per way a decision or a commit can end: strings,
// so that logs and metric labels read well.
const (
	EventBypass         = "bypass"          // idem did not apply (safe method, no key where optional)
	EventClaim          = "claim"           // the request owns the key; the handler runs
	EventReplay         = "replay"          // a stored response was replayed
	EventConflict       = "conflict"        // 409: the key is in flight elsewhere
	EventMismatch       = "mismatch"        // 422: the key was used with another request
	EventNotRetained    = "not_retained"    // 409: completed, response not kept
	EventRejected       = "rejected"        // refused before the claim (Event.Problem says why)
	EventStoreError     = "store_error"     // 503: the claim failed
	EventCanceled       = "canceled"        // the client went away before the claim
	EventCommit         = "commit"          // a final response was stored
	EventFail           = "fail"            // a retryable response: the key was released
	EventAbort          = "abort"           // the handler failed (panic, error, disconnect): key released
	EventLeaseLost      = "lease_lost"      // Commit or Abort found the lease taken over
	EventHeartbeatError = "heartbeat_error" // a lease renewal failed
	EventStalled        = "stalled"         // a completer took over a stalled execution to finish it (core/completer)
	EventAbandoned      = "abandoned"       // a completer left a stalled execution to operators: too old (core/completer)
)

// Event is reported to the observer for each decision and commit. It never
// carries the idempotency key.
type Event struct {
	Kind string // one of the Event* constants
	// Problem is the problem name (problem.InFlight, ...) of a refusal or
	// failure answer, "" otherwise. problem.Lookup gives its status. A
	// bypass names problem.MissingKey when the request had no key and keys
	// are optional (WithKeyRequired(false)): nothing was refused, but the
	// count is what tells when keys can be required.
	Problem  string
	Scope    string
	Route    string        // canonical route template (see adapterkit.CanonicalRoute); "" when the request had none (its path stood in, Request.Route)
	Status   int           // response status, when there is one
	Duration time.Duration // time spent in the store call(s)
	// Err is the cause of a failure: a store error, a scope function's
	// error, a handler's panic or error. Errors the engine reports never
	// contain the raw key.
	Err error
}
