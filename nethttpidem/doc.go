// Package nethttpidem adapts idem to net/http: Middleware protects handlers
// (it works with http.ServeMux and chi), and Transport is the client side
// that adds and keeps an Idempotency-Key across retries.
package nethttpidem
