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
// Adapters (nethttpidem, ginidem, echoidem, fiberidem) only translate: they
// build a Request, call Decide, run the handler with a Recorder, and call
// Commit or Abort. Every policy lives here. core uses the standard library
// only.
package core
