package problem

import "net/http"

// BaseURI prefixes the type of every problem idem writes. The URIs are
// stable; each is documented in the README ("Problem types").
const BaseURI = "https://idemkit.dev/problems/"

// Problem names, appended to BaseURI to form a Details.Type.
const (
	MissingKey       = "missing-key"       // 400: the key header is required and absent
	InvalidKey       = "invalid-key"       // 400: not a valid sf-string or token, too long, several lines
	PayloadMismatch  = "payload-mismatch"  // 422: the key was used with another method, route or body
	InFlight         = "in-flight"         // 409: the first request with this key is still running
	NotRetained      = "not-retained"      // 409: completed, but its response was too large or streamed to keep
	BodyTooLarge     = "body-too-large"    // 413: the request body exceeds the limit
	BodyUnreadable   = "body-unreadable"   // 400: the request body could not be read
	StoreUnavailable = "store-unavailable" // 503: the store could not be reached, or the outcome not recorded
	ScopeUnavailable = "scope-unavailable" // 401: the tenant could not be determined (scope function failed, or named none)
	HandlerPanic     = "handler-panic"     // 500: the handler panicked; the key may be retried
	HandlerError     = "handler-error"     // 500: the handler failed and wrote no response
	Canceled         = "request-canceled"  // 499: the client went away before the claim
)

// statusClientClosedRequest is the status of Canceled (nginx's 499): the
// client went away, so the answer goes nowhere; it is not a server failure
// and not a store outage.
const statusClientClosedRequest = 499

// Details is an RFC 9457 problem detail, the body of every refusal or
// failure idem answers.
type Details struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// catalogue is the one name -> status and title table, in a stable order.
var catalogue = []Details{
	{MissingKey, "Idempotency key missing", http.StatusBadRequest, ""},
	{InvalidKey, "Idempotency key invalid", http.StatusBadRequest, ""},
	{PayloadMismatch, "Idempotency key reused with a different request", http.StatusUnprocessableEntity, ""},
	{InFlight, "Request with this idempotency key is in progress", http.StatusConflict, ""},
	{NotRetained, "Response for this idempotency key was not retained", http.StatusConflict, ""},
	{BodyTooLarge, "Request body too large", http.StatusRequestEntityTooLarge, ""},
	{BodyUnreadable, "Request body unreadable", http.StatusBadRequest, ""},
	{StoreUnavailable, "Idempotency store unavailable", http.StatusServiceUnavailable, ""},
	{ScopeUnavailable, "Request scope unavailable", http.StatusUnauthorized, ""},
	{HandlerPanic, "Internal server error", http.StatusInternalServerError, ""},
	{HandlerError, "Internal server error", http.StatusInternalServerError, ""},
	{Canceled, "Request canceled", statusClientClosedRequest, ""},
}

// Lookup returns the problem a name stands for, its Type under BaseURI,
// and whether idem has such a problem.
func Lookup(name string) (Details, bool) {
	for _, d := range catalogue {
		if d.Type == name {
			d.Type = BaseURI + name
			return d, true
		}
	}
	return Details{}, false
}

// All returns every problem idem answers, in a stable order, Types under
// BaseURI.
func All() []Details {
	out := make([]Details, len(catalogue))
	for i, d := range catalogue {
		d.Type = BaseURI + d.Type
		out[i] = d
	}
	return out
}
