// Package fiberidem adapts idem to Fiber (github.com/gofiber/fiber/v2): New
// returns a fiber.Handler that runs the rest of the chain at most once per
// (scope, Idempotency-Key), replays the recorded response to retries, and
// refuses a key reused with a different request.
//
//	idem, err := fiberidem.New(eng, fiberidem.WithScope(userID)) // required: records are per tenant
//	app.Post("/v1/payments", idem, createPayment)
//
// The adapter only translates; every policy (which methods, key syntax,
// fingerprint, what is stored, problem responses) is the engine's, see
// package core.
//
// # Fiber specifics
//
//   - fasthttp reuses request and response buffers: strings from c.Get,
//     c.Path, c.Method and slices from c.Body or c.Response().Body() change
//     under you after the handler returns. fiberidem copies every header
//     value the engine reads (the key, fingerprint headers, allow-listed
//     response headers; all request headers for a core.WithScope function),
//     the method, the route, the scope and the response body before the
//     engine or the store sees them, and keeps no reference to the
//     *fiber.Ctx after the handler returns.
//   - The route in the fingerprint is c.Route().Path when idem is mounted on
//     the route, and the request path when it is registered with app.Use
//     (see WithRoute). Registered with app.Use or Group.Use, idem runs
//     before fiber routes the request; it matches the path against the
//     app's routes itself (fiber.RoutePatternMatch), and a request no route
//     serves goes on to fiber's own 404 or 405 untouched.
//   - The body is fingerprinted as received (c.Request().Body()): a body
//     sent with Content-Encoding: gzip, deflate or br is hashed compressed,
//     as the other adapters hash it. It is read only for a request idem
//     protects, after the method, route, key and scope checks. With
//     fiber.Config.StreamRequestBody the stream is read up to
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
//     which cuts a client that sends slowly. With StreamRequestBody, a
//     handler on a request idem passes through (a GET, a request WithSkip
//     skips) that calls c.Body() reads the stream without BodyLimit.
//   - The handler's context is c.UserContext(), which carries the lease;
//     the previous user context is restored when the handler returns.
//   - An error returned by the handler is rendered by the app's error
//     handler (c.App().ErrorHandler, which honours mounted sub-apps) inside
//     the middleware, so the stored response is what the client saw; the
//     error is not returned further up the chain. A fiber.NewError(400, ...)
//     is therefore stored and replayed; a plain error renders 500, which
//     the default policy leaves retryable.
//   - A panic in the handler is recovered: the key is released (Abort) and a
//     500 problem is written in place of whatever the handler had set.
//     Headers that middleware before idem had set are kept.
//   - Responses with a body stream (c.SendStream,
//     c.Context().SetBodyStreamWriter, large c.SendFile) or a hijacked
//     connection are recorded as streamed, bodies larger than
//     core.WithMaxResponseBytes as truncated: a retry gets the not-retained
//     problem, never a second execution. fasthttp sends a body stream only
//     after the handler returns, so even those responses are replaced by a
//     problem when Commit fails.
//   - Register compression (middleware/compress) with app.Use before idem,
//     so that idem records the uncompressed response and each replay is
//     compressed for the retry's own Accept-Encoding. Compression inside
//     idem is recorded as is (body and Content-Encoding) and replayed
//     compressed whatever the retry accepts.
//   - Not idem's, but met by every service that drains on SIGTERM: fasthttp
//     counts a connection on which no request has arrived yet as busy, and
//     its graceful shutdown (app.ShutdownWithTimeout) waits for it, so a
//     client's unused spare connection holds the shutdown for its whole
//     timeout. Set fiber.Config.ReadTimeout (examples/payments uses 5s).
package fiberidem
