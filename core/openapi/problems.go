package openapi

import (
	"strings"

	"github.com/idemkit/idem/core"
)

// problemSpec is one problem idem answers with, as published.
type problemSpec struct {
	name   string
	status int
	when   string // when it is answered, for the published description
}

// problemWhen says, per problem name, when a client gets it.
var problemWhen = map[string]string{
	core.ProblemMissingKey:       "the key header is missing",
	core.ProblemInvalidKey:       "the key is not a valid key (format, length, several header lines)",
	core.ProblemBodyUnreadable:   "the request body could not be read",
	core.ProblemScopeUnavailable: "the request's tenant could not be determined",
	core.ProblemInFlight:         "a request with this key is still in progress (retry after Retry-After seconds)",
	core.ProblemNotRetained:      "the request with this key completed but its response was too large or streamed to keep; it is not run again",
	core.ProblemBodyTooLarge:     "the request body is larger than the limit",
	core.ProblemPayloadMismatch:  "the key was already used with a different request (method, route, target or body)",
	core.ProblemHandlerPanic:     "the request failed without completing; it may be retried with the same key",
	core.ProblemHandlerError:     "the request failed without a response; it may be retried with the same key",
	core.ProblemStoreUnavailable: "the idempotency store could not be reached or the result could not be recorded; retry with the same key",
}

// publishedProblems lists the problems a protected operation may answer,
// from the problem table (core.Problems), in its order. A cancelled
// request's 499 goes to no one and is not published; missing-key only
// where the key is required.
func publishedProblems(p core.Policy) []problemSpec {
	var out []problemSpec
	for _, info := range core.Problems() {
		name := strings.TrimPrefix(info.Type, core.ProblemBaseURI)
		switch {
		case name == core.ProblemCanceled:
			continue
		case name == core.ProblemMissingKey && !p.KeyRequired:
			continue
		}
		when := problemWhen[name]
		if when == "" {
			when = info.Title
		}
		out = append(out, problemSpec{name, info.Status, when})
	}
	return out
}

// replayedHeader is p.ReplayedHeader, or its default (core.ReplayedHeader)
// for a Policy built by hand.
func replayedHeader(p core.Policy) string {
	if p.ReplayedHeader == "" {
		return core.ReplayedHeader
	}
	return p.ReplayedHeader
}
