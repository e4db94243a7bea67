package idemtest

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
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

func (s failComplete) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
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
	if w, ok := s.Store.(storekit.Watcher); ok {
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
	requireProblem(t, r, http.StatusUnauthorized, problem.ScopeUnavailable)
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
	requireProblem(t, r, http.StatusServiceUnavailable, problem.StoreUnavailable)
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
		requireProblem(t, r, http.StatusServiceUnavailable, problem.StoreUnavailable)
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
	requireProblem(t, r, http.StatusServiceUnavailable, problem.StoreUnavailable)
	if v := r.header.Get("Retry-After"); v != "3" {
		t.Errorf("503 Retry-After = %q, want 3 (WithRetryAfter)", v)
	}
}
