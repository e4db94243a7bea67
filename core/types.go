package core

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/idemkit/idem/core/adapterkit"
)

// Outcome is what Decide tells the adapter to do.
type Outcome int

const (
	// Bypass: idem does not apply (safe method, or no key where keys are
	// optional). Run the handler as if idem were absent.
	Bypass Outcome = iota
	// Proceed: this request owns the key. Run the handler on Decision.Context,
	// capture its response, then call Commit (or Abort).
	Proceed
	// Replay: write Decision.Response, the stored response of the first
	// request, marked with Idempotent-Replayed: true.
	Replay
	// Reject: write Decision.Response, a problem response (400, 401, 409,
	// 413, 422 or 503). The handler must not run.
	Reject
)

func (o Outcome) String() string {
	switch o {
	case Bypass:
		return "bypass"
	case Proceed:
		return "proceed"
	case Replay:
		return "replay"
	case Reject:
		return "reject"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// errNotOwner: Commit or Abort on a decision that is not Proceed (an
// adapter's bug: Serve never does it).
var errNotOwner = errors.New("idem: decision does not own the key")

// Request is what an adapter hands to Decide.
type Request struct {
	Method string
	// Route is the route template ("/v1/payments/:id", in any framework's
	// spelling: see adapterkit.CanonicalRoute). It is part of the
	// fingerprint. Empty when the adapter could not learn it (the
	// middleware wraps a handler that routes after it): the path of Target
	// is fingerprinted in its place, and events (Event.Route) and log lines
	// name no route, since a path chosen by the client must not become a
	// metric label, one series per path.
	Route string
	// Target is the request target as received, path and query
	// (r.URL.RequestURI()). It is part of the fingerprint, so one key reused
	// on /orders/1/confirm and /orders/2/confirm is refused (422) rather than
	// replayed. Adapters always set it.
	Target string
	// Header holds the request headers: the key header and any headers
	// named by WithFingerprintHeaders are read from it.
	Header http.Header
	// HeaderReader is read instead of Header when Header is nil, for
	// frameworks that keep headers in their own form (fasthttp): the engine
	// asks only for the headers it needs. A ScopeFunc set with WithScope may
	// read any header from Header; for it, the engine fills Header from
	// HeaderReader's Header() http.Header method if it has one.
	HeaderReader adapterkit.HeaderReader
	// Body is the request body as received (not decoded: a gzip body is
	// hashed compressed, as every adapter hashes the bytes on the wire).
	// Decide reads it, up to the request limit, only for a request it
	// protects, after the method, route, key and scope checks; the adapter
	// then gives the handler Decision.Body. An adapterkit.BodyBytes (a body
	// the framework holds in memory, fasthttp) is hashed in place instead,
	// never kept: the handler reads the body from the framework as usual,
	// and Decision.Body is nil, BodyRead false. May be nil.
	Body io.Reader
	// NoRoute, when not nil, reports that no route of the application
	// matches the request (the framework will answer 404 or 405 itself).
	// Decide asks it only for a method it protects, before anything else:
	// such a request is a Bypass, with nothing claimed or recorded and the
	// body untouched. Adapters that cannot know leave it nil.
	NoRoute func() bool
	// Scope is the tenant, when the adapter knows it up front.
	Scope string
	// ScopeFunc, when set, is called instead (only for requests idem
	// protects) to find the tenant; an error answers 401. Adapters set it
	// from their scope option; it is the type WithScope takes, so one
	// function serves either place. WithScope replaces both.
	ScopeFunc ScopeFunc

	// call: built by Engine.Call, not by an adapter: protected whatever
	// the engine's methods, scoped by Scope alone (see call.go).
	call bool
}

// values reads one request header from Header or HeaderReader.
func (r *Request) values(name string) []string {
	if r.Header == nil && r.HeaderReader != nil {
		return r.HeaderReader.Values(name)
	}
	return r.Header.Values(name)
}

// fingerprintHeader returns what the fingerprint reads the headers named
// by WithFingerprintHeaders from: Header, or those headers read from
// HeaderReader.
func (r *Request) fingerprintHeader(names []string) http.Header {
	if len(names) == 0 || r.Header != nil || r.HeaderReader == nil {
		return r.Header
	}
	h := make(http.Header, len(names))
	for _, n := range names {
		n = http.CanonicalHeaderKey(n)
		if v := r.HeaderReader.Values(n); len(v) > 0 {
			h[n] = v
		}
	}
	return h
}
