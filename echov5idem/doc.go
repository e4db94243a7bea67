// Package echov5idem adapts idem to Echo v5 (github.com/labstack/echo/v5).
// For Echo v4 use package echoidem.
//
// New builds the middleware that runs a handler at most once per (scope,
// Idempotency-Key): the first request claims the key and runs the handler,
// a retry of the same request gets the stored response again (marked
// Idempotent-Replayed: true), a concurrent duplicate gets 409, and the same
// key with a different request gets 422. All of that is decided by the
// engine in package core, and so is the flow around the handler
// (core.Engine.Serve); this package only translates Echo's context. New
// fails without a scope function (WithScope) unless the engine opted into
// core.WithSharedKeySpace.
//
// # Why a package apart from echoidem
//
// Echo v5 is a new major version with a new import path, and its API is not
// v4's: the context is a struct (*echo.Context, not the echo.Context
// interface), c.Response() is an http.ResponseWriter that unwraps to
// *echo.Response (not *echo.Response itself), the matched route is
// c.RouteInfo(), errors are rendered by Echo#HTTPErrorHandler (there is no
// c.Error), and middleware.Skipper takes the new context. One package cannot
// hold middleware for both without importing both majors, so every user
// would download and build the one they do not use; its own module
// (github.com/idemkit/idem/echov5idem) also keeps v5's newer Go requirement
// away from v4 users. The two adapters record the same route and
// fingerprint for the same request, so a fleet can move from v4 to v5 in a
// rolling deploy: retries replay across versions.
//
// # Mounting
//
// Register the middleware with Echo#Use, Group#Use or per route. Under
// Echo#Pre the router has not run yet: there is no route, so the request
// path is recorded as the route and every request of a protected method is
// protected, served by a route or not.
//
// Registered with Echo#Use or Group#Use, the middleware also runs for
// requests no route serves (echo's 404 and 405, a RouteNotFound handler):
// those pass through untouched, with no key required and nothing recorded.
// Echo v5 tells them apart itself: c.RouteInfo() names no method for a 404
// or 405, and the RouteNotFound method for a RouteNotFound handler.
//
// How it fits Echo:
//
//   - The handler's response is buffered by a adapterkit.Recorder, so the
//     outcome is recorded before the client sees it. The capture sits
//     right under the handler, above the writers outer middleware
//     installed (Gzip, BodyDump): what is stored is what the handler wrote,
//     and the first response and its replays go out through those writers
//     alike. The handler writes to a *echo.Response of its own over the
//     capture (its Committed tells the error handler what it wrote); the
//     app's *echo.Response sees the response when it is sent.
//   - An error returned by the handler is rendered by the app's
//     HTTPErrorHandler while the response is still being captured, so the
//     stored response is exactly what the client saw; the middleware then
//     returns nil so Echo does not render it a second time.
//   - The handler's request context carries the lease (core.KeyFromContext,
//     core.RelayKey, pgstore.Tx); outer middleware gets the original
//     request back once the handler returns.
//   - Replays and rejections are written through c.Response(), so outer
//     middleware (logging, CORS, compression) sees them like any response.
//   - A panicking handler releases the key and answers a 500 problem; the
//     panic does not propagate to an outer Recover middleware unless the
//     response was already streaming, in which case http.ErrAbortHandler is
//     re-panicked so the connection is dropped.
package echov5idem
