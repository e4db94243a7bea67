// Package otelidem reports idem's engine through OpenTelemetry: metrics
// from the engine's observer (core.WithObserver) and spans from a store
// decorator, so every store call idem makes is a child of the request's
// span.
//
//	tel, err := otelidem.New()                       // global providers by default
//	store := tel.Store(pgStore)                      // spans around claim, complete, fail, heartbeat, wait
//	eng, err := core.New(store, core.WithObserver(tel.Observer()), ...)
//
// Metrics (instrumentation scope "github.com/idemkit/idem/otelidem"):
//
//	idem.decisions          counter    every decision: idem.outcome (bypass, claim, replay, conflict,
//	                                   mismatch, not_retained, rejected, store_error, canceled;
//	                                   stalled and abandoned from core/completer),
//	                                   http.route, idem.problem, http.response.status_code
//	                                   (a bypass with idem.problem=missing-key is a request sent without
//	                                   a key while keys are optional: the count a roll-out waits on)
//	idem.commits            counter    every commit: idem.outcome (commit, fail, abort, lease_lost), http.route
//	idem.store.duration     histogram  seconds spent in the store per phase: idem.phase (decide, commit)
//	idem.lease.lost         counter    executions that lost their lease (at commit, or found by a heartbeat)
//	idem.heartbeat.errors   counter    failed lease renewals
//	idem.waits              counter    duplicates that waited for an in-flight owner (core.WithWait)
//	idem.wait.duration      histogram  seconds a duplicate waited
//
// Spans (from Store): idem.claim (idem.claim.outcome: claimed, replay,
// not_retained, in_flight, mismatch; idem.record.status), idem.complete,
// idem.fail (idem.fenced_out when the lease was lost), idem.heartbeat,
// idem.wait; each with http.route and http.request.method where known, and
// the error (key redacted) on failure.
//
// http.route on metrics is the matched route template only: a request
// whose route is its raw path (core.Request.Route empty: the middleware
// wraps a whole mux, or no route matched) has no http.route, so that paths
// chosen by unauthenticated clients cannot create one series each.
//
// Never the idempotency key, in any attribute, span event or status
// message: keys are capabilities, and as a label they would explode the
// metric's cardinality. The scope (tenant) is left out too unless
// WithScopeAttribute asks for it.
package otelidem
