// Package core is idem's framework-neutral engine: it decides, for every
// request carrying an Idempotency-Key, whether the handler runs (Proceed), a
// stored response is replayed (Replay), or the request is refused (Reject),
// and records the outcome with a fenced Commit or Abort.
//
// Idempotency here is ownership of the execution, not a cache of results:
// Decide atomically claims (scope, key) in the Store before the handler runs,
// so a duplicate arriving while the first request is still in flight gets 409
// (or waits), across every instance sharing the store. The claim is a lease
// the engine heartbeats while the handler runs; a dead owner's lease lapses
// and a retry takes over, and the stale owner's late Commit is refused
// (ErrLeaseLost) because every write is conditional on its lease token.
//
// A handler with several side effects marks each with Step (or StepJSON):
// a recovery point whose result is stored, fenced by the lease, so an owner
// that takes the key over resumes after it instead of repeating the effect.
// Stores offer it as an optional capability, storekit.StepStore.
//
// Adapters (nethttpidem, ginidem, echoidem, echov5idem, fiberidem) only
// translate: they build a Request and an adapterkit.Exchange (how to run the
// framework's chain with a capture, write a response, call the user's
// error handler) and call Engine.Serve, which owns the whole flow: Decide,
// the handler on the lease's context, panic -> Abort + 500, Commit, the
// answer to a failed commit. Every policy lives here too: outcomes carry a
// machine-readable problem name (Decision.Problem; the catalogue is core/problem), observer
// events have named kinds (EventClaim, ...), and routes are recorded in canonical form
// (adapterkit.CanonicalRoute), so a fleet mixing frameworks shares records.
//
// Work that is not an HTTP request (a queue consumer, a job, a gRPC
// method: grpcidem) uses Engine.Call (or CallJSON): the same flow, run by
// Decide and Serve's runner, with a key, a scope, a name and an input
// instead of a request; its refusals are *CallError values matched with
// errors.Is (ErrInFlight, ErrMismatch, ErrStoreUnavailable, ...). Its
// records carry method storekit.CallMethod ("CALL") and the call's name as route.
//
// Tenancy fails closed: a request that names no scope is refused (401,
// ErrNoScope) and adapters refuse to be built without a scope function,
// unless the engine opts into one shared key space (WithSharedKeySpace).
//
// No idempotency key appears in what the engine logs, reports or returns:
// keys are logged as a short hash (RedactKey), and text
// from elsewhere (store errors, a scope function's error, a handler's error
// or panic value) is scrubbed of the key (storekit.ScrubText: verbatim, Go-, JSON-,
// SQL- and URL-escaped, hex; at any key length, a form shorter than 8
// bytes where it stands alone) before it is logged, observed or handed to
// an error handler or an adapter.
//
// This package holds what a service author uses. Store authors find the
// records, fences and store capabilities in core/storekit, adapter authors
// the Exchange and response capture in core/adapterkit; core/storetest and
// core/idemtest are their conformance suites. core and both kits use the
// standard library only.
package core
