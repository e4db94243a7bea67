// Package adapterkit is for adapter authors: what an adapter between a
// web framework and core.Engine implements and uses. An adapter builds a
// core.Request from the framework's request and an Exchange (run the rest
// of the chain under a capture, write a response, call the user's error
// handler), then calls core.Engine.Serve, which owns the flow. Recorder is
// the capture for frameworks built on http.ResponseWriter; Response is a
// response as captured or as idem writes it.
//
// Service authors do not need it: they mount an adapter (nethttpidem,
// ginidem, echoidem, fiberidem). adapterkit imports only the standard
// library, never core; core/idemtest is the conformance suite every
// adapter must pass.
package adapterkit
