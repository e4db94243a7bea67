// Package completer finishes executions whose owner died after a step and
// whose client never came back: the customer was charged (a step stored the
// charge), the booking never happened, and no retry will ever arrive.
//
// A Completer looks for records still processing whose lease lapsed, that
// hold at least one stored step and whose route it was given (HTTP, Call). It
// sends the request again through the application, as the client's retry
// would: the engine takes the record over (fenced, like any takeover), the
// handler resumes from its stored steps (the provider is not called again)
// and the response is stored, so the client's late retry gets it replayed.
//
// What a re-run needs is kept only for the routes given here: from the
// moment New returns, the engine keeps each such request (method, target,
// body, Content-Type, Content-Encoding, the fingerprint headers and the
// headers the route names; never the key header) and stores it with the
// execution's first step, in the same write, bounded by core.MaxStepBytes.
// It goes with the record. A route not given keeps nothing and is never
// touched. Register the same routes on every instance.
//
// The scope of a re-run is the record's: the kept request carries no
// credentials, and the engine does not call the scope function for it.
// Every instance may run a Completer at once: each record is taken over by
// one of them, the others find it owned. A record older than WithMaxAge is
// left to operators (idemctl stuck, idemctl release). To compensate instead
// of finishing (refund the charge), give the route a handler that does that,
// wrapped by the same idem middleware: it runs under the taken-over lease, and
// core.Step hands it the stored charge.
//
// Events: core.EventStalled when a re-run takes a record over (the usual
// commit event follows), core.EventAbandoned for a record left as too old.
package completer
