// Package fiberv3idem adapts idem to Fiber v3 (github.com/gofiber/fiber/v3).
// For Fiber v2 use package fiberidem.
//
// New returns a fiber.Handler that runs the rest of the chain at most once
// per (scope, Idempotency-Key): the first request claims the key and runs
// the handler, a retry of the same request gets the stored response again
// (marked Idempotent-Replayed: true), a concurrent duplicate gets 409, and
// the same key with a different request gets 422. All of that is decided
// by the engine in package core, and so is the flow around the handler
// (core.Engine.Serve); this package only translates fiber's context.
//
//	idem, err := fiberv3idem.New(eng, fiberv3idem.WithScope(userID)) // required: records are per tenant
//	app.Post("/v1/payments", idem, createPayment)
//
// # Why a package apart from fiberidem
//
// Fiber v3 is a new major version with a new import path, and its API is
// not v2's: the context is an interface (fiber.Ctx, not *fiber.Ctx), the
// handler's context.Context is c.Context() and c.SetContext() (v2's
// c.UserContext()), fasthttp's context is c.RequestCtx() (v2's
// c.Context()), and the listener's options moved to fiber.ListenConfig.
// One package cannot hold middleware for both without importing both
// majors. The two adapters record the same route and fingerprint for the
// same request, so a fleet can move from v2 to v3 in a rolling deploy:
// retries replay across versions.
//
// # Fiber specifics
//
//   - fasthttp reuses request and response buffers: strings from c.Get and
//     c.Path and slices from c.Body or c.Response().Body() change under
//     you after the handler returns. fiberv3idem copies every header value
//     the engine reads (the key, fingerprint headers, allow-listed response
//     headers; all request headers for a core.WithScope function), the
//     route, the scope and the response body before the engine or the
//     store sees them, and keeps no reference to the fiber.Ctx after the
//     handler returns.
//   - The route in the fingerprint is c.Route().Path when idem is mounted
//     on the route, and the request path when it is registered with
//     app.Use or Group.Use (see WithRoute). Registered that way, idem runs
//     before fiber reaches a route (c.Matched() is false); it matches the
//     path against the app's routes itself (fiber.RoutePatternMatch), and
//     a request no route serves goes on to fiber's own 404 or 405
//     untouched.
//   - The handler's context is c.Context(), which carries the lease
//     (core.KeyFromContext, core.RelayKey, pgstore.Tx); the previous
//     context is restored when the handler returns. fiber.Ctx is a
//     context.Context itself, but one whose values are the request's
//     Locals: pass c.Context(), not c, where the lease is needed.
//   - The body is fingerprinted as received (c.Request().Body()): a body
//     sent with Content-Encoding: gzip, deflate, br or zstd is hashed
//     compressed, as the other adapters hash it. It is read only for a
//     request idem protects, after the method, route, key and scope checks.
//     With fiber.Config.StreamRequestBody the stream is read up to
//     core.WithMaxRequestBytes and handed back.
//   - fiber's c.Body() inflates a compressed body without any bound: a
//     request of 1 MiB can inflate to gigabytes. Every request that passes
//     through idem (protected or not, but not one WithSkip skips) has its
//     body decoded by idem instead, up to core.WithMaxRequestBytes, and
//     Content-Encoding removed, so the handler's c.Body() returns the
//     bounded, decoded bytes. A body that inflates past the limit gets 413,
//     one that does not decode 400, an unknown coding 415; the handler does
//     not run, and for a protected request the answer is recorded. On a
//     route without idem, or one WithSkip skips, do not call c.Body() on a
//     body a client may compress: read c.Request().Body() (the bytes as
//     received) or decode it with a bound of your own.
//   - fasthttp reads the whole request body, sized by its Content-Length,
//     before any handler or idem runs: fiber's default BodyLimit lets every
//     connection that declares 4 MB take 4 MB, however slowly it sends.
//     Set fiber.Config.StreamRequestBody, so that idem reads the body
//     within core.WithMaxRequestBytes (examples/payments does), or a
//     BodyLimit that fits a payments body; and fiber.Config.ReadTimeout,
//     which cuts a client that sends slowly and keeps a connection on
//     which no request arrives from holding a graceful shutdown
//     (app.ShutdownWithTimeout).
//   - An error returned by the handler is rendered by the app's error
//     handler (c.App().ErrorHandler, which honours mounted sub-apps) inside
//     the middleware, so the stored response is what the client saw; the
//     error is not returned further up the chain. A fiber.NewError(400, ...)
//     is therefore stored and replayed; a plain error renders 500, which
//     the default policy leaves retryable.
//   - A panic in the handler is recovered by the engine: the key is
//     released and a 500 problem is written in place of whatever the
//     handler had set. Headers that middleware before idem had set are
//     kept.
//   - Responses with a body stream (c.SendStream, c.SendStreamWriter, a
//     large c.SendFile) or a hijacked connection are recorded as streamed,
//     bodies larger than core.WithMaxResponseBytes as truncated: a retry
//     gets the not-retained problem, never a second execution. fasthttp
//     sends a body stream only after the handler returns, so even those
//     responses are replaced by a problem when the outcome cannot be
//     recorded.
//   - Register compression (middleware/compress) with app.Use before idem,
//     so that idem records the uncompressed response and each replay is
//     compressed for the retry's own Accept-Encoding.
package fiberv3idem
