package openapi

import (
	"github.com/idemkit/idem/core/problem"
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
	problem.MissingKey:       "the key header is missing",
	problem.InvalidKey:       "the key is not a valid key (format, length, several header lines)",
	problem.BodyUnreadable:   "the request body could not be read",
	problem.ScopeUnavailable: "the request's tenant could not be determined",
	problem.InFlight:         "a request with this key is still in progress (retry after Retry-After seconds)",
	problem.NotRetained:      "the request with this key completed but its response was too large or streamed to keep; it is not run again",
	problem.BodyTooLarge:     "the request body is larger than the limit",
	problem.PayloadMismatch:  "the key was already used with a different request (method, route, target or body)",
	problem.HandlerPanic:     "the request failed without completing; it may be retried with the same key",
	problem.HandlerError:     "the request failed without a response; it may be retried with the same key",
	problem.StoreUnavailable: "the idempotency store could not be reached or the result could not be recorded; retry with the same key",
}

// publishedProblems lists the problems a protected operation may answer,
// from the problem table (problem.All), in its order. A cancelled
// request's 499 goes to no one and is not published; missing-key only
// where the key is required.
func publishedProblems(p core.Policy) []problemSpec {
	var out []problemSpec
	for _, info := range problem.All() {
		name := strings.TrimPrefix(info.Type, problem.BaseURI)
		switch {
		case name == problem.Canceled:
			continue
		case name == problem.MissingKey && !p.KeyRequired:
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
