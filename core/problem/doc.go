// Package problem is the catalogue of the answers idem gives instead of
// running the handler: each is an RFC 9457 problem detail
// (application/problem+json) whose type is a stable URI under BaseURI,
// so clients may switch on it. Decisions, events and Engine.Call's
// CallError carry the bare name (InFlight, PayloadMismatch, ...); Lookup
// gives its status and title, for adapters that answer in another protocol
// (grpcidem) and for documentation (core/openapi).
package problem
