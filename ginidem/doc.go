// Package ginidem adapts idem to gin: New builds middleware that makes gin
// handlers safe to retry with the Idempotency-Key header. The handler runs at most once per
// (scope, key); a retry of the same request gets the first response back,
// byte for byte, marked Idempotent-Replayed: true; a concurrent duplicate
// gets 409 and a retry with a different body under the same key 422.
//
// The adapter is thin: every decision is made by the core.Engine. It reads
// the route template from c.FullPath(), hands the handler the request body
// again after fingerprinting it, and swaps c.Writer for a capturing writer
// while the rest of the chain runs, so that c.JSON, c.String, c.Data,
// c.Status and c.AbortWithStatusJSON are all recorded; the response reaches
// the client only once its outcome is stored.
//
// Register the middleware on the routes it protects, after authentication
// (the scope usually comes from it) and before the handler:
//
//	eng, _ := core.New(store)
//	idem, err := ginidem.New(eng, ginidem.WithScope(userFrom)) // required: records are per tenant
//	r.POST("/v1/payments", auth, idem, createPayment)
//
// It may also be installed with r.Use: gin then runs it for requests no
// route matched too (c.FullPath() is ""), which pass through to gin's own
// 404/405 untouched, with no key required and nothing recorded.
//
// The request context (c.Request.Context()) carries the lease while the chain
// runs: core.KeyFromContext and core.RelayKey read it, and pgstore.Tx finds
// its transaction there. gin.Context itself delegates to it only when the
// engine's ContextWithFallback is set; otherwise pass c.Request.Context().
//
// Handler errors: a chain that writes a response (c.AbortWithStatus,
// c.AbortWithError, c.JSON, ...) has that response recorded and sent. A chain
// that only records errors with c.Error and writes nothing is a failed
// execution, classified by the outcome policy as a 500 (by default the key is
// released for a retry); the response is left to an error-rendering
// middleware registered outside this one, with status 500 preset, so a chain
// without one answers 500, never an empty 200. A panic releases the
// key and answers a 500 problem; it is not re-raised (gin.Recovery sees
// nothing; the panic is added to c.Errors for logging middleware) unless
// part of the response had already gone out.
//
// Responses that cannot be replayed: a chain that flushes (c.Stream,
// c.SSEvent with Flush), hijacks, or writes past the capture (re-routing with
// engine.HandleContext resets c.Writer to gin's own) sends its response as
// written; the key is then recorded as "not retained" and a retry gets a 409
// problem instead of a second execution.
//
// Compression: register a compressing middleware (gin-contrib/gzip) outside
// this one, so that idem records the plain body and each answer, replays
// included, is encoded for the client asking. Inside it, the compressed body
// is what gets stored, and a retry is replayed with the first request's
// Content-Encoding whatever its own Accept-Encoding says.
package ginidem
