package core

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/core/adapterkit"
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

// statusClientClosedRequest is the status of ProblemCanceled (nginx's 499):
// the client went away, so the answer goes nowhere; it is not a server
// failure and not a store outage.
const statusClientClosedRequest = 499

// problemRow is one row of the problem table.
type problemRow struct {
	Name   string // e.g. ProblemInFlight
	Status int
	Title  string
}

// problems is the one problem name -> status/title table.
var problems = []problemRow{
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
	{ProblemCanceled, statusClientClosedRequest, "Request canceled"},
}

var problemIndex = func() map[string]problemRow {
	m := make(map[string]problemRow, len(problems))
	for _, p := range problems {
		m[p.Name] = p
	}
	return m
}()

// Problem is an RFC 9457 problem detail: the body of every refusal or
// failure idem answers (application/problem+json). Its Type is a problem
// name (ProblemInFlight, ...) under ProblemBaseURI (or WithProblemBaseURI);
// Decision.Problem and Event.Problem carry the bare name, and
// LookupProblem gives the Problem a name stands for.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// LookupProblem returns the problem a name stands for (Decision.Problem,
// Event.Problem), with its status and title and Type under ProblemBaseURI,
// so that a non-HTTP adapter (gRPC, a job runner) can map a Decision
// without parsing its body.
func LookupProblem(name string) (Problem, bool) {
	r, ok := problemIndex[name]
	if !ok {
		return Problem{}, false
	}
	return r.problem(ProblemBaseURI, 0, ""), true
}

// Problems returns every problem idem answers, in a stable order (for
// documentation such as an OpenAPI description).
func Problems() []Problem {
	out := make([]Problem, len(problems))
	for i, r := range problems {
		out[i] = r.problem(ProblemBaseURI, 0, "")
	}
	return out
}

// problem is the row as a Problem under base; status 0 is the row's.
func (r problemRow) problem(base string, status int, detail string) Problem {
	if status == 0 {
		status = r.Status
	}
	return Problem{Type: base + r.Name, Title: r.Title, Status: status, Detail: detail}
}

// problemResponse builds the problem+json response for a problem name.
// status 0 takes the status from the problem table.
func problemResponse(base, name string, status int, detail string) *adapterkit.Response {
	if base == "" {
		base = ProblemBaseURI
	}
	r := problemIndex[name]
	r.Name = name
	p := r.problem(base, status, detail)
	status = p.Status
	body, err := json.Marshal(p)
	if err != nil { // cannot happen with these field types; keep a valid body anyway
		body = []byte(`{"status":` + strconv.Itoa(status) + `}`)
	}
	h := make(http.Header, 3)
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	return &adapterkit.Response{Status: status, Header: h, Body: body}
}

// problem builds the engine's problem response for name (status from the
// table, type under WithProblemBaseURI). Answers that invite a retry
// (in-flight, store-unavailable) carry Retry-After from
// WithRetryAfter.
func (e *Engine) problem(name, detail string) *adapterkit.Response {
	r := problemResponse(e.cfg.problemBaseURI, name, 0, detail)
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

// panicResponse is the 500 problem answered when the handler panicked
// before its response went out. The key is released (Abort) so the client
// may retry.
func (e *Engine) panicResponse() *adapterkit.Response {
	return e.problem(ProblemHandlerPanic, "the request failed; it was not completed and may be retried with the same key")
}
