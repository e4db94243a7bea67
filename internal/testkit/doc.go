// Package testkit holds the assertion and leak-check helpers of the root module's tests.
//
// The root module (core, memstore, the conformance kits, nethttpidem) depends on the standard
// library only, tests included, so that importing it adds nothing to a service's module graph.
// The subpackages assert and require mirror the subset of testify's API these tests use (same
// names, same argument order), and leak mirrors goleak.VerifyTestMain; the other modules keep
// using testify and goleak themselves.
package testkit
