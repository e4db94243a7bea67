package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// The cross-adapter scenarios: behaviour every adapter must share because
// the flow is core's (core.Engine.Serve), not the adapter's.
func init() {
	scenarios = append(scenarios,
		scenario{"no_scope_cannot_be_built", scNoScope},
		scenario{"scope_error_401_logged", scScopeError},
		scenario{"silent_error_handler_problem", scSilentErrorHandler},
		scenario{"commit_failure_503", scCommitFailure},
		scenario{"handler_error_through_policy", scHandlerError},
		scenario{"nil_options", scNilOptions},
		scenario{"retry_after_option", scRetryAfterOption},
		scenario{"sentinel_key_never_logged", scSentinelKey},
	)
}

// failComplete wraps a store whose Complete fails. With leaseLost it
// releases the record first, so the real store answers ErrLeaseLost (its
// own error message); otherwise it releases it and fails with an error
// that quotes the key, as a careless store might.
type failComplete struct {
	core.Store
	leaseLost bool
}

func (s failComplete) Complete(ctx context.Context, f core.Fence, resp core.StoredResponse) error {
	if err := s.Store.Fail(ctx, f); err != nil {
		return err
	}
	if s.leaseLost {
		return s.Store.Complete(ctx, f, resp)
	}
	return fmt.Errorf("idemtest: commit failed for key %q", f.Key)
}

// Watch keeps the wrapped store's Watcher visible.
func (s failComplete) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	if w, ok := s.Store.(core.Watcher); ok {
		return w.Watch(ctx, scope, key)
	}
	return nil, nil
}

// capture collects log output and every error string idem hands out.
type capture struct {
	log  LogBuffer
	mu   sync.Mutex
	errs []string
}

func (c *capture) err(err error) {
	if err == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, fmt.Sprintf("%v | %+v", err, err))
}

func (c *capture) options() []core.Option {
	return []core.Option{
		core.WithLogger(slog.New(slog.NewTextHandler(&c.log, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		core.WithObserver(func(ev core.Event) { c.err(ev.Err) }),
	}
}

func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.String() + strings.Join(c.errs, "\n")
}

func scNoScope(t *testing.T, e *env) {
	var n atomic.Int64
	err := e.startConfig(Config{NoScope: true}, []Route{{"POST", "/pay", payHandler(&n)}}, nil)
	if err == nil {
		t.Fatal("the adapter was built without a scope function and without core.WithSharedKeySpace")
	}
	if !strings.Contains(err.Error(), "WithScope") || !strings.Contains(err.Error(), "WithSharedKeySpace") {
		t.Errorf("construction error %q does not name the scope option and the opt-in", err)
	}
	// With the explicit opt-in it is built, and every client shares one key space.
	if err := e.startConfig(Config{NoScope: true}, []Route{{"POST", "/pay", payHandler(&n)}}, nil, core.WithSharedKeySpace()); err != nil {
		t.Fatalf("with core.WithSharedKeySpace: %v", err)
	}
	key := e.key("shared")
	first := e.do(call{method: "POST", path: "/pay", key: key, tenant: e.tenant("a"), body: payBody})
	if first.status != http.StatusCreated {
		t.Fatalf("shared key space: %v", first)
	}
	sameResponse(t, first, e.do(call{method: "POST", path: "/pay", key: key, tenant: e.tenant("b"), body: payBody}))
	count(t, &n, 1)
}

var errNoSession = errors.New("idemtest: no session for this request")

func scScopeError(t *testing.T, e *env) {
	var n atomic.Int64
	var c capture
	if err := e.startConfig(Config{ScopeErr: errNoSession}, []Route{{"POST", "/pay", payHandler(&n)}}, nil, c.options()...); err != nil {
		t.Fatal(err)
	}
	r := e.do(call{method: "POST", path: "/pay", key: e.key("scope"), tenant: e.tenant("a"), body: payBody})
	problem(t, r, http.StatusUnauthorized, core.ProblemScopeUnavailable)
	count(t, &n, 0)
	if !strings.Contains(c.String(), errNoSession.Error()) {
		t.Errorf("the scope function's error is neither logged nor in the event:\n%s", c.String())
	}
	if strings.Contains(string(r.body), errNoSession.Error()) {
		t.Errorf("the scope function's error reached the client: %s", r.body)
	}
}

func scSilentErrorHandler(t *testing.T, e *env) {
	var n atomic.Int64
	var saw atomic.Int32
	cfg := Config{SilentErrorHandler: true, ErrorHandlerSaw: func(error) { saw.Add(1) }}
	if err := e.startConfig(cfg, []Route{{"POST", "/pay", payHandler(&n)}}, func(s core.Store) core.Store { return FailingStore{Store: s} }); err != nil {
		t.Fatal(err)
	}
	r := e.do(call{method: "POST", path: "/pay", key: e.key("silent"), tenant: e.tenant("a"), body: payBody})
	problem(t, r, http.StatusServiceUnavailable, core.ProblemStoreUnavailable)
	retryAfter(t, r)
	count(t, &n, 0)
	if saw.Load() != 1 {
		t.Errorf("error handler called %d times, want 1", saw.Load())
	}
}

func scCommitFailure(t *testing.T, e *env) {
	for _, silent := range []bool{false, true} {
		var n atomic.Int64
		if err := e.startConfig(Config{SilentErrorHandler: silent}, []Route{{"POST", "/pay", payHandler(&n)}},
			func(s core.Store) core.Store { return failComplete{Store: s} }); err != nil {
			t.Fatal(err)
		}
		c := call{method: "POST", path: "/pay", key: e.key(fmt.Sprint("commit-", silent)), tenant: e.tenant("a"), body: payBody}
		r := e.do(c)
		// The handler's 201 is not known to be recorded: never sent.
		problem(t, r, http.StatusServiceUnavailable, core.ProblemStoreUnavailable)
		retryAfter(t, r)
		count(t, &n, 1)
	}
}

func scHandlerError(t *testing.T, e *env) {
	if e.adapter.NoHandlerErrors {
		return // nothing to report an error through
	}
	var n atomic.Int64
	if err := e.startConfig(Config{HandlerError: errors.New("idemtest: provider down")}, []Route{{"POST", "/pay", payHandler(&n)}}, nil); err != nil {
		t.Fatal(err)
	}
	c := call{method: "POST", path: "/pay", key: e.key("herr"), tenant: e.tenant("a"), body: payBody}
	for i := 1; i <= 2; i++ {
		r := e.do(c)
		// The framework renders it (500 by default) or idem answers the
		// handler-error problem: never a success, never a replay.
		if r.status < 500 || replayed(r) {
			t.Errorf("handler error, attempt %d: %v replayed=%v, want a 5xx", i, r, replayed(r))
		}
	}
	// The outcome policy classifies the 500 as retryable: each retry runs.
	count(t, &n, 2)
}

func scNilOptions(t *testing.T, e *env) {
	var n atomic.Int64
	if err := e.startConfig(Config{NilOptions: true}, []Route{{"POST", "/pay", payHandler(&n)}}, nil); err != nil {
		t.Fatalf("nil options: %v", err)
	}
	c := call{method: "POST", path: "/pay", key: e.key("nil"), tenant: e.tenant("a"), body: payBody}
	first := e.do(c)
	if first.status != http.StatusCreated {
		t.Fatalf("nil options: %v", first)
	}
	sameResponse(t, first, e.do(c))
	count(t, &n, 1)
}

func scRetryAfterOption(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, func(s core.Store) core.Store { return FailingStore{Store: s} },
		core.WithRetryAfter(3*time.Second))
	r := e.do(call{method: "POST", path: "/pay", key: e.key("ra"), tenant: e.tenant("a"), body: payBody})
	problem(t, r, http.StatusServiceUnavailable, core.ProblemStoreUnavailable)
	if v := r.header.Get("Retry-After"); v != "3" {
		t.Errorf("503 Retry-After = %q, want 3 (WithRetryAfter)", v)
	}
}

// sentinelKey is a key no log line, event error, error-handler error or
// problem body may contain.
const sentinelKey = "SENTINEL-7f3a9c1e-idem-key-must-never-leak"

// scSentinelKey drives one sentinel key down every error path an adapter
// and a store have (store down with an error quoting the key, commit
// failure quoting it, lease lost, payload mismatch, in flight, scope
// error, handler panic and error) with the engine logging everything, and
// fails if the key appears anywhere.
func scSentinelKey(t *testing.T, e *env) {
	var c capture
	opts := append(c.options(), core.WithLease(time.Second))
	saw := func(err error) { c.err(err) }
	check := func(what string, r *result) {
		t.Helper()
		if r != nil && bytes.Contains(r.body, []byte(sentinelKey)) {
			t.Errorf("%s: the key is in the response body: %s", what, r.body)
		}
	}
	var n atomic.Int64
	g := newGate()
	e.openOnCleanup(g)
	routes := []Route{
		{"POST", "/pay", payHandler(&n)},
		{"POST", "/slow", blockingPayHandler(&n, g)},
		{"POST", "/panic", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("idemtest: deliberate panic") })},
	}
	tenant := e.tenant("s")
	pay := call{method: "POST", path: "/pay", key: sentinelKey, tenant: tenant, body: payBody}

	// Store down, its error quoting the key.
	down := FailingStore{Err: fmt.Errorf("connection lost while claiming %q", sentinelKey)}
	if err := e.startConfig(Config{ErrorHandlerSaw: saw}, routes, func(s core.Store) core.Store { down.Store = s; return down }, opts...); err != nil {
		t.Fatal(err)
	}
	check("store down", e.do(pay))
	// Commit failure quoting the key, then lease lost (the store's own error).
	for _, lost := range []bool{false, true} {
		if err := e.startConfig(Config{ErrorHandlerSaw: saw}, routes, func(s core.Store) core.Store { return failComplete{Store: s, leaseLost: lost} }, opts...); err != nil {
			t.Fatal(err)
		}
		check("commit failure", e.do(pay))
	}
	// A healthy store: first, replay, mismatch, in flight, panic, scope error.
	if err := e.startConfig(Config{ErrorHandlerSaw: saw}, routes, nil, opts...); err != nil {
		t.Fatal(err)
	}
	check("first", e.do(pay))
	check("replay", e.do(pay))
	check("mismatch", e.do(call{method: "POST", path: "/pay", key: sentinelKey, tenant: tenant, body: `{"amount":5}`}))
	slow := call{method: "POST", path: "/slow", key: sentinelKey, tenant: e.tenant("slow"), body: payBody}
	done := make(chan *result, 1)
	go func() {
		r, err := e.send(slow)
		if err != nil {
			t.Errorf("slow: %v", err)
		}
		done <- r
	}()
	if !g.waitEntered(waitTimeout) {
		t.Fatal("slow handler never started")
	}
	check("in flight", e.do(slow))
	g.Open()
	check("slow", <-done)
	if r, err := e.send(call{method: "POST", path: "/panic", key: sentinelKey, tenant: tenant, body: payBody}); err == nil {
		check("panic", r)
	}
	if err := e.startConfig(Config{ScopeErr: fmt.Errorf("no session for key %s", sentinelKey), ErrorHandlerSaw: saw}, routes, nil, opts...); err != nil {
		t.Fatal(err)
	}
	check("scope error", e.do(pay))

	out := c.String()
	if strings.Contains(out, sentinelKey) {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, sentinelKey) {
				t.Errorf("the raw key leaked: %s", line)
			}
		}
	}
	if !strings.Contains(out, "idem:") {
		t.Errorf("nothing was logged; the test proves nothing:\n%s", out)
	}
}
