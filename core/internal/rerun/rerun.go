// Package rerun is what core and core/completer share to finish stalled
// executions: the request core keeps for a completer, how it rides with a
// step, the context mark of a completer's re-run, and the hook by which a
// completer tells an engine which routes to keep requests for. It is
// internal so that none of it becomes API.
package rerun

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"
)

// Request is a request as kept for a completer: enough to send it again.
// The key is not in it (the record names it); nor is any header the
// application did not list.
type Request struct {
	Method string      `json:"m"`
	Target string      `json:"t"`
	Header http.Header `json:"h,omitempty"`
	Body   []byte      `json:"b,omitempty"`
}

// Prefix marks the stored name of the step that carries the request: the
// first step an execution stores is saved as Prefix+name with Wrap's value.
// Step names cannot hold control characters, so it never collides with one.
const Prefix = "\x1f"

// Wrap returns the value of a step saved with the request: the request's
// encoding, length-prefixed, then the step's result.
func Wrap(req, result []byte) []byte {
	out := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(req)+len(result)), uint64(len(req)))
	return append(append(out, req...), result...)
}

// Unwrap splits a value made by Wrap.
func Unwrap(v []byte) (req, result []byte, ok bool) {
	n, w := binary.Uvarint(v)
	if w <= 0 || n > uint64(len(v)-w) {
		return nil, nil, false
	}
	return v[w : w+int(n)], v[w+int(n):], true
}

// Encode and Decode are the request's stored form.
func Encode(r Request) ([]byte, error) { return json.Marshal(r) }

// Decode is Encode's inverse.
func Decode(b []byte) (Request, error) {
	var r Request
	err := json.Unmarshal(b, &r)
	return r, err
}

// Routes names the routes whose requests an engine keeps, by Route's
// string, with the headers to keep for each.
type Routes map[string][]string

// Route is the Routes key of a record's method and route.
func Route(method, route string) string { return method + " " + route }

// Mark is carried by the context of a completer's re-run: the record it
// finishes. The engine takes the scope from it (a stored request carries
// no credentials) and refuses to run the handler unless its claim took over
// that very incarnation (Born, the record's CreatedAt).
type Mark struct {
	Scope string
	Born  time.Time
	// Took, when set, is set by the engine when the re-run's claim took
	// the record over (the handler runs): a completer tells its own
	// re-run from another instance's.
	Took *atomic.Bool
}

type markKey struct{}

// With returns ctx carrying m.
func With(ctx context.Context, m Mark) context.Context { return context.WithValue(ctx, markKey{}, m) }

// From returns the mark ctx carries.
func From(ctx context.Context) (Mark, bool) {
	m, ok := ctx.Value(markKey{}).(Mark)
	return m, ok
}

// Hooks core sets at init for core/completer, which cannot see an
// engine's unexported state: Keep makes the engine (a *core.Engine) keep
// the requests of routes; Observe reports an event of kind to its
// observer; Warn logs err with the engine's logger.
var (
	Keep    func(engine any, routes Routes)
	Observe func(engine any, kind, scope, route string)
	Warn    func(engine any, msg string, err error)
)
