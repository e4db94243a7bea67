// Package echoidem adapts idem to Echo (github.com/labstack/echo/v4).
//
// New builds the middleware that runs a handler at most once per (scope, Idempotency-Key):
// the first request claims the key and runs the handler, a retry of the
// same request gets the stored response again (marked
// Idempotent-Replayed: true), a concurrent duplicate gets 409, and the same
// key with a different request gets 422. All of that is decided by the
// engine in package core, and so is the flow around the handler
// (core.Engine.Serve); this package only translates Echo's context. New
// fails without a scope function (WithScope) unless the engine opted into
// core.WithSharedKeySpace.
//
// Register the middleware with Echo#Use, Group#Use or per route, never with
// Echo#Pre: the route template from c.Path() is part of the request
// fingerprint, and Pre middleware runs before the router sets it (the
// request path is used then; the router is still asked whether a route
// serves the request, so nothing goes unprotected).
//
// Registered with Echo#Use or Group#Use, the middleware also runs for
// requests no route serves (echo's 404 and 405, a RouteNotFound handler):
// those pass through untouched, with no key required and nothing recorded.
// It finds them by asking the router for a route of the request's method
// at c.Path(); routes registered on a host router (Echo#Host) are looked
// up on that host's router.
//
// How it fits Echo:
//
//   - The handler's response is buffered by a adapterkit.Recorder installed as
//     c.Response().Writer, so the outcome is recorded before the client sees
//     it. echo.Response keeps tracking Status, Size and Committed as usual;
//     after the middleware returns they describe what was actually sent.
//   - An error returned by the handler is rendered by the app's
//     HTTPErrorHandler (c.Error) while the response is still being captured,
//     so the stored response is exactly what the client saw; the middleware
//     then returns nil so Echo does not render it a second time.
//   - The handler's request context carries the lease (core.KeyFromContext,
//     core.RelayKey, pgstore.Tx); outer middleware gets the original request
//     back once the handler returns.
//   - Replays and rejections are written through c.Response(), so outer
//     middleware (logging, CORS, compression) sees them like any response.
//   - A panicking handler releases the key and answers a 500 problem; the
//     panic does not propagate to an outer Recover middleware unless the
//     response was already streaming, in which case http.ErrAbortHandler is
//     re-panicked so the connection is dropped.
package echoidem
