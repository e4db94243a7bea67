package core

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/problem"
)

// statusClientClosedRequest is the status of problem.Canceled (nginx's 499).
const statusClientClosedRequest = 499

// problemResponse builds the problem+json response for a problem name.
// status 0 takes the status from the catalogue (core/problem).
func problemResponse(name string, status int, detail string) *adapterkit.Response {
	p, _ := problem.Lookup(name)
	p.Type = problem.BaseURI + name // an unknown name still names itself
	if status != 0 {
		p.Status = status
	}
	p.Detail = detail
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
// catalogue, type under problem.BaseURI). Answers that invite a retry
// (in-flight, store-unavailable) carry Retry-After from
// WithRetryAfter.
func (e *Engine) problem(name, detail string) *adapterkit.Response {
	r := problemResponse(name, 0, detail)
	switch name {
	case problem.InFlight, problem.StoreUnavailable:
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
	return e.problem(problem.HandlerPanic, "the request failed; it was not completed and may be retried with the same key")
}
