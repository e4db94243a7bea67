package core

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// ProblemBaseURI prefixes the `type` of every problem idem writes. The URIs
// are stable: clients may switch on them. Each is documented in the README
// ("Problem types").
const ProblemBaseURI = "https://idemkit.dev/problems/"

// Problem names (appended to the base URI). Decision.Problem and
// Event.Problem carry them; LookupProblem gives each one's status and title.
const (
	ProblemMissingKey       = "missing-key"       // 400: the key header is required and absent
	ProblemInvalidKey       = "invalid-key"       // 400: not a valid sf-string or token, too long, several lines
	ProblemPayloadMismatch  = "payload-mismatch"  // 422: the key was used with another method, route or body
	ProblemInFlight         = "in-flight"         // 409: the first request with this key is still running
	ProblemNotRetained      = "not-retained"      // 409: completed, but its response was too large or streamed to keep
	ProblemBodyTooLarge     = "body-too-large"    // 413: the request body exceeds the limit
	ProblemBodyUnreadable   = "body-unreadable"   // 400: the request body could not be read
	ProblemStoreUnavailable = "store-unavailable" // 503: the store could not be reached, or the outcome not recorded
	ProblemScopeUnavailable = "scope-unavailable" // 401: the tenant could not be determined (scope function failed, or named none)
	ProblemHandlerPanic     = "handler-panic"     // 500: the handler panicked; the key may be retried
	ProblemHandlerError     = "handler-error"     // 500: the handler failed and wrote no response
	ProblemCanceled         = "request-canceled"  // 499: the client went away before the claim
)

// StatusClientClosedRequest is the status of ProblemCanceled (nginx's 499):
// the client went away, so the answer goes nowhere; it is not a server
// failure and not a store outage.
const StatusClientClosedRequest = 499

// ProblemInfo is one row of the problem table.
type ProblemInfo struct {
	Name   string // e.g. ProblemInFlight
	Status int
	Title  string
}

// problems is the one problem name -> status/title table.
var problems = []ProblemInfo{
	{ProblemMissingKey, http.StatusBadRequest, "Idempotency key missing"},
	{ProblemInvalidKey, http.StatusBadRequest, "Idempotency key invalid"},
	{ProblemPayloadMismatch, http.StatusUnprocessableEntity, "Idempotency key reused with a different request"},
	{ProblemInFlight, http.StatusConflict, "Request with this idempotency key is in progress"},
	{ProblemNotRetained, http.StatusConflict, "Response for this idempotency key was not retained"},
	{ProblemBodyTooLarge, http.StatusRequestEntityTooLarge, "Request body too large"},
	{ProblemBodyUnreadable, http.StatusBadRequest, "Request body unreadable"},
	{ProblemStoreUnavailable, http.StatusServiceUnavailable, "Idempotency store unavailable"},
	{ProblemScopeUnavailable, http.StatusUnauthorized, "Request scope unavailable"},
	{ProblemHandlerPanic, http.StatusInternalServerError, "Internal server error"},
	{ProblemHandlerError, http.StatusInternalServerError, "Internal server error"},
	{ProblemCanceled, StatusClientClosedRequest, "Request canceled"},
}

var problemIndex = func() map[string]ProblemInfo {
	m := make(map[string]ProblemInfo, len(problems))
	for _, p := range problems {
		m[p.Name] = p
	}
	return m
}()

// LookupProblem returns the status and title of a problem name, so that a
// non-HTTP adapter (gRPC, a job runner) can map a Decision without parsing
// its body.
func LookupProblem(name string) (ProblemInfo, bool) {
	p, ok := problemIndex[name]
	return p, ok
}

// Problems returns the problem table, in a stable order (for documentation
// such as an OpenAPI description).
func Problems() []ProblemInfo { return append([]ProblemInfo(nil), problems...) }

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// ProblemResponse builds the problem+json response for a problem name.
// status 0 takes the status from the problem table.
func ProblemResponse(base, name string, status int, detail string) *Response {
	if base == "" {
		base = ProblemBaseURI
	}
	info := problemIndex[name]
	if status == 0 {
		status = info.Status
	}
	p := Problem{Type: base + name, Title: info.Title, Status: status, Detail: detail}
	body, err := json.Marshal(p)
	if err != nil { // cannot happen with these field types; keep a valid body anyway
		body = []byte(`{"status":` + strconv.Itoa(status) + `}`)
	}
	h := make(http.Header, 3)
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	return &Response{Status: status, Header: h, Body: body}
}

// Problem builds the engine's problem response for name (status from the
// table, type under WithProblemBaseURI). Answers that invite a retry
// (in-flight, store-unavailable) carry Retry-After from
// WithRetryAfter.
func (e *Engine) Problem(name, detail string) *Response {
	r := ProblemResponse(e.cfg.problemBaseURI, name, 0, detail)
	switch name {
	case ProblemInFlight, ProblemStoreUnavailable:
		r.Header.Set("Retry-After", strconv.FormatInt(e.retryAfterSeconds(), 10))
	}
	return r
}

// retryAfterSeconds is WithRetryAfter in whole seconds, rounded up.
func (e *Engine) retryAfterSeconds() int64 {
	return max(int64((e.cfg.retryAfter+time.Second-1)/time.Second), 1)
}

// PanicResponse is the 500 problem answered when the handler panicked
// before its response went out. The key is released (Abort) so the client
// may retry.
func (e *Engine) PanicResponse() *Response {
	return e.Problem(ProblemHandlerPanic, "the request failed; it was not completed and may be retried with the same key")
}
