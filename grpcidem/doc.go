// Package grpcidem makes unary gRPC methods idempotent with idem: a
// server interceptor runs each protected call at most once per (scope,
// key) across every server sharing the engine's store, and answers a
// retry with the stored response; a client interceptor gives each logical
// call a key that gRPC's retries keep.
//
// It is core.Engine.Call underneath: the same lease and heartbeat,
// fencing, takeover of a crashed server's calls once their lease lapses,
// core.WithWait for duplicates, core.Step and core.RelayKey in handlers,
// and the transactional mode (pgstore.Tx, mysqlstore.Tx in a handler
// commit with the response). Records are method "CALL" with the method's
// full name as route, so idemctl and otelidem show them next to HTTP ones.
//
// # Server
//
//	ic, err := grpcidem.UnaryServerInterceptor(engine,
//		grpcidem.WithScope(tenantOf),
//		grpcidem.WithMethods("/payments.v1.Payments/Charge"))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic))
//
// The key is the idempotency-key metadata (KeyHeader); the methods to
// protect are opt-in (WithMethods), others pass through untouched. The
// fingerprint is the method's full name and the request message,
// marshalled deterministically. The stored response is the handler's
// message marshalled deterministically; a replay sends exactly those
// bytes, with idempotent-replayed: true in the response header metadata
// (ReplayedHeader). Interceptors outside this one see a replayed
// response as an opaque message, not as the method's response type.
//
// A handler error (any status) is returned as is and releases the key,
// so a retry runs the method again: answer a final business outcome (a
// declined card) with a response, not an error. A handler that idem
// stopped because its lease was lost is answered Aborted (in-flight), not
// with its context's Canceled, which no retry policy retries.
//
// # Status codes
//
// idem's answers, by problem (problem.InFlight, ...; see Code):
//
//	answer                                  problem             code
//	a call with the key is in flight        in-flight           Aborted, with retry-after (seconds) and
//	  (or its owner lost the key)                                 grpc-retry-pushback-ms in the trailer
//	the key was used with another request   payload-mismatch    FailedPrecondition
//	completed, response too large to keep   not-retained        AlreadyExists
//	no idempotency-key, or several          missing-key         InvalidArgument
//	an invalid key                          invalid-key         InvalidArgument
//	no tenant (WithScope failed)            scope-unavailable   Unauthenticated
//	request over WithMaxRequestBytes        body-too-large      ResourceExhausted
//	store unreachable, or the response      store-unavailable   Unavailable
//	  could not be recorded
//	the caller went away before the claim   request-canceled    Canceled
//	the handler panicked                    handler-panic       Internal
//
// What a client can expect: Aborted and Unavailable from idem mean "retry
// with the same key" — the call ran at most once and a retry finds its
// result or runs it; put both in the retry policy's retryableStatusCodes.
// The others are final for that key.
//
// # Client
//
//	conn, err := grpc.NewClient(target,
//		grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()),
//		grpc.WithDefaultServiceConfig(`{"methodConfig": [{"name": [{"service": "payments.v1.Payments"}],
//		  "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "2s",
//		  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]}}]}`))
//
// The client interceptor sets a fresh key on each logical call that has
// none. gRPC's retry policy re-sends an attempt below the interceptors
// with the same metadata, so every attempt of one call carries one key
// (the package's tests check it).
//
// # Streaming
//
// Streaming methods pass through: there is no stream interceptor. A
// stream's messages have no single response to store and replay.
package grpcidem
