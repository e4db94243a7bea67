package core

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem/core/internal/rerun"
	"github.com/idemkit/idem/core/problem"
	"github.com/idemkit/idem/core/storekit"
)

// Requests kept for a completer (core/completer).
//
// A completer finishes an execution whose owner died after a step: it sends
// the request again through the application, as the client's retry would.
// For that the request must outlive its owner, so for the routes a completer
// registered the engine keeps it (method, target, body, the content and
// fingerprint headers and those the route named; never the key header) and
// stores it with the first step the execution saves, in the same write:
// an execution with no stored step has nothing to finish, and one that has
// a step has its request. Steps go with the record, so does the request.

// alwaysKept are kept for every registered route: a handler needs them to
// read the body it is sent again.
var alwaysKept = []string{"Content-Type", "Content-Encoding"}

// keepRequest returns req encoded for a completer when its route is
// registered, else nil. A request whose encoding is over MaxStepBytes is not
// kept (logged): a completer then leaves its execution to the client.
func (e *Engine) keepRequest(ctx context.Context, req *Request, method, route string, body []byte, key string) []byte {
	routes := e.keep.Load()
	if routes == nil {
		return nil
	}
	names, ok := (*routes)[rerun.Route(method, route)]
	if !ok {
		return nil
	}
	var h http.Header
	for _, list := range [][]string{alwaysKept, e.cfg.fpHeaders, names} {
		for _, n := range list {
			n = http.CanonicalHeaderKey(n)
			if n == e.cfg.header || h.Get(n) != "" {
				continue
			}
			if v := req.values(n); len(v) > 0 {
				if h == nil {
					h = http.Header{}
				}
				h[n] = append([]string(nil), v...)
			}
		}
	}
	b, err := rerun.Encode(rerun.Request{Method: method, Target: req.Target, Header: h, Body: body})
	if err == nil && len(b) > MaxStepBytes {
		err = fmt.Errorf("%d bytes encoded, over %d", len(b), MaxStepBytes)
	}
	if err != nil {
		e.log(ctx, slog.LevelWarn, "request_not_kept", key, "", route, slog.Any("err", e.scrub(err, key)))
		return nil
	}
	return b
}

// abandonClaim answers a completer's re-run whose claim did not take over
// the stalled record but made a new one (it expired meanwhile): the new
// record is released at once, untouched, and the handler does not run.
func (e *Engine) abandonClaim(ctx context.Context, d *Decision, rec *storekit.Record, took time.Duration) {
	f := storekit.Fence{Scope: d.Scope, Key: d.Key, Token: rec.Token}
	if err := e.store.Fail(context.WithoutCancel(ctx), f); err != nil {
		e.log(ctx, slog.LevelWarn, "abandon_release_failed", d.Key, d.Scope, d.route, slog.Any("err", e.scrub(err, d.Key)))
	}
	e.refuse(ctx, d, EventAbandoned, problem.InFlight, http.StatusConflict, took,
		"the execution to finish is gone; nothing was run")
}
