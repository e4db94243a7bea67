package core

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemBaseURI prefixes the `type` of every problem idem writes. The URIs
// are stable: clients may switch on them. Each is documented in the README
// ("Problem types").
const ProblemBaseURI = "https://idemkit.dev/problems/"

// Problem types (appended to the base URI).
const (
	ProblemMissingKey       = "missing-key"       // 400: the key header is required and absent
	ProblemInvalidKey       = "invalid-key"       // 400: not a valid sf-string or token, too long, several lines
	ProblemPayloadMismatch  = "payload-mismatch"  // 422: the key was used with another method, route or body
	ProblemInFlight         = "in-flight"         // 409: the first request with this key is still running
	ProblemNotRetained      = "not-retained"      // 409: completed, but its response was too large or streamed to keep
	ProblemBodyTooLarge     = "body-too-large"    // 413: the request body exceeds the limit
	ProblemBodyUnreadable   = "body-unreadable"   // 400: the request body could not be read (client went away)
	ProblemStoreUnavailable = "store-unavailable" // 503: the store could not be reached; nothing ran
	ProblemScopeUnavailable = "scope-unavailable" // 401: the request's tenant could not be determined
	ProblemHandlerPanic     = "handler-panic"     // 500: the handler panicked; the key may be retried
)

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

var problemTitles = map[string]string{
	ProblemMissingKey:       "Idempotency key missing",
	ProblemInvalidKey:       "Idempotency key invalid",
	ProblemPayloadMismatch:  "Idempotency key reused with a different request",
	ProblemInFlight:         "Request with this idempotency key is in progress",
	ProblemNotRetained:      "Response for this idempotency key was not retained",
	ProblemBodyTooLarge:     "Request body too large",
	ProblemBodyUnreadable:   "Request body unreadable",
	ProblemStoreUnavailable: "Idempotency store unavailable",
	ProblemScopeUnavailable: "Request scope unavailable",
	ProblemHandlerPanic:     "Internal server error",
}

// ProblemResponse builds the problem+json response for a problem name.
func ProblemResponse(base, name string, status int, detail string) *Response {
	if base == "" {
		base = ProblemBaseURI
	}
	p := Problem{Type: base + name, Title: problemTitles[name], Status: status, Detail: detail}
	body, err := json.Marshal(p)
	if err != nil { // cannot happen with these field types; keep a valid body anyway
		body = []byte(`{"status":` + strconv.Itoa(status) + `}`)
	}
	h := make(http.Header, 2)
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	return &Response{Status: status, Header: h, Body: body}
}

// PanicResponse is what adapters write when the handler panicked before
// writing anything: a 500 problem. The key is released (Abort) so the client
// may retry.
func (e *Engine) PanicResponse() *Response {
	return ProblemResponse(e.cfg.problemBaseURI, ProblemHandlerPanic, http.StatusInternalServerError,
		"the request failed; it was not completed and may be retried with the same key")
}
