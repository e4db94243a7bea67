// Package nethttpidem adapts idem to net/http: New builds the middleware that
// protects handlers (it works with http.ServeMux and chi; see New for where
// to mount it), and Transport is the client side that adds and keeps an
// Idempotency-Key across retries.
//
// The middleware only translates: the request into a core.Request (route
// from r.Pattern as ServeMux or chi set it, or from the ServeMux it wraps,
// in canonical form; a request no route matches passes to the mux
// untouched), the writer into an
// adapterkit.Recorder; the flow (decide, run,
// capture, commit, panics, failures) is core.Engine.Serve. New fails without a scope function (WithScope) unless the engine opted
// into core.WithSharedKeySpace.
package nethttpidem
