// Package openapi renders the idempotency policy an engine runs with
// (core.Policy) as OpenAPI 3.1, for an API description: the key header
// parameter (format, length, whether it is required), the replay marker and
// Retry-After response headers, the RFC 9457 problem schema with one
// response per problem status, and the policy itself (methods, retention,
// lease, wait, fingerprint, limits) as the x-idempotency extension. The IETF
// draft (draft-ietf-httpapi-idempotency-key-header) asks every resource to
// publish its policy, expiry included.
//
// Render the engine's policy once, mark the operations idem guards, and
// merge the fragment into the API's document:
//
//	frag := openapi.New(eng.Policy())
//	frag.Protect(http.MethodPost, createPayment) // an operation object
//	frag.AddTo(doc)                              // the API's OpenAPI document
//
// Or publish the policy alone: frag.Document("payments idempotency", "1").
//
// The package imports only the standard library and core.
package openapi
