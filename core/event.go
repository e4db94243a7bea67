package core

import "time"

// EventKind says what an Event reports. It is a string so that logs and
// metric labels read well; compare against the constants.
type EventKind string

// The event kinds, one per way a decision or a commit can end.
const (
	EventBypass         EventKind = "bypass"          // idem did not apply (safe method, no key where optional)
	EventClaim          EventKind = "claim"           // the request owns the key; the handler runs
	EventReplay         EventKind = "replay"          // a stored response was replayed
	EventConflict       EventKind = "conflict"        // 409: the key is in flight elsewhere
	EventMismatch       EventKind = "mismatch"        // 422: the key was used with another request
	EventNotRetained    EventKind = "not_retained"    // 409: completed, response not kept
	EventRejected       EventKind = "rejected"        // refused before the claim (Event.Problem says why)
	EventStoreError     EventKind = "store_error"     // 503: the claim failed
	EventCanceled       EventKind = "canceled"        // the client went away before the claim
	EventCommit         EventKind = "commit"          // a final response was stored
	EventFail           EventKind = "fail"            // a retryable response: the key was released
	EventAbort          EventKind = "abort"           // the handler failed (panic, error, disconnect): key released
	EventLeaseLost      EventKind = "lease_lost"      // Commit or Abort found the lease taken over
	EventHeartbeatError EventKind = "heartbeat_error" // a lease renewal failed
)

// Event is reported to the observer for each decision and commit. It never
// carries the idempotency key.
type Event struct {
	Kind EventKind
	// Problem is the problem name (ProblemInFlight, ...) of a refusal or
	// failure answer, "" otherwise. LookupProblem gives its status. A
	// bypass names ProblemMissingKey when the request had no key and keys
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
