package idemtest

import (
	"encoding/json"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// scSentinelKey drives each of SentinelKeys down every error path an
// adapter and a store have, with the engine logging everything and the
// framework's own logger and panic recovery writing to the capture: store
// down with an error quoting the key, commit failure quoting it, lease
// lost, payload mismatch, in flight, a scope error naming the key, handler
// panics whose values carry the key (before and after the response went
// out), a handler error naming it. It fails if the key, in any of its
// forms (KeyLeaks), appears in a log line, an event's error, an error
// handler's error, a response body or header, or the framework's log.
func scSentinelKey(t *testing.T, e *env) {
	for _, s := range SentinelKeys() {
		t.Run(s.Name, func(t *testing.T) {
			sentinelPaths(t, &env{t: t, adapter: e.adapter, newStore: e.newStore}, s)
		})
	}
}

// keyText is a text carrying key the ways careless code writes one.
func keyText(what, key string) string {
	j, _ := json.Marshal(key)
	return fmt.Sprintf("%s for key %q (raw: %s; json: %s)", what, key, key, j)
}

func sentinelPaths(t *testing.T, e *env, s Sentinel) {
	var c Capture
	opts := append(c.Options(), core.WithLease(time.Second))
	fw := c.Writer()     // the framework's log
	bodies := c.Writer() // every response idem gave
	cfg := Config{ErrorHandlerSaw: c.Err, Log: fw}
	seen := func(what string, r *result, err error) {
		t.Helper()
		if err != nil {
			c.Text(what + ": " + err.Error())
			return
		}
		fmt.Fprintf(bodies, "%s: %d %v %s\n", what, r.status, r.header, r.body)
	}
	key := HeaderValue(s.Key)

	var n atomic.Int64
	g := newGate()
	e.openOnCleanup(g)
	routes := []Route{
		{"POST", "/pay", payHandler(&n)},
		{"POST", "/slow", blockingPayHandler(&n, g)},
		{"POST", "/panic", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			panic(keyText("idemtest: charge failed", s.Key))
		})},
		{"POST", "/panic-error", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			panic(fmt.Errorf("idemtest: %s", keyText("provider refused", s.Key)))
		})},
		// The response is out when it panics: idem lets the server drop
		// the connection (http.ErrAbortHandler), and whatever recovers
		// that on the way (gin's Recovery dumps the request) must not find
		// the key either.
		{"POST", "/flush-panic", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"partial":`))
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			panic(keyText("idemtest: failed mid-response", s.Key))
		})},
	}
	tenant := e.tenant("s")
	pay := call{method: "POST", path: "/pay", key: key, tenant: tenant, body: payBody}
	send := func(what string, c call) *result {
		t.Helper()
		r, err := e.send(c)
		seen(what, r, err)
		return r
	}

	if !s.Valid {
		if err := e.startConfig(cfg, routes, nil, opts...); err != nil {
			t.Fatal(err)
		}
		if r := send("invalid key", pay); r != nil {
			requireProblem(t, r, http.StatusBadRequest, problem.InvalidKey)
		}
		c.NoKey(t, s.Key)
		return
	}

	// Store down, its error carrying the key.
	down := FailingStore{Err: fmt.Errorf("idemtest: %s", keyText("connection lost while claiming", s.Key))}
	if err := e.startConfig(cfg, routes, func(st core.Store) core.Store { down.Store = st; return down }, opts...); err != nil {
		t.Fatal(err)
	}
	send("store down", pay)
	// Commit failure quoting the key, then lease lost (the store's own error).
	for _, lost := range []bool{false, true} {
		if err := e.startConfig(cfg, routes, func(st core.Store) core.Store { return failComplete{Store: st, leaseLost: lost} }, opts...); err != nil {
			t.Fatal(err)
		}
		send(fmt.Sprint("commit failure, lease lost ", lost), pay)
	}
	// A healthy store: first, replay, mismatch, in flight, panics.
	if err := e.startConfig(cfg, routes, nil, opts...); err != nil {
		t.Fatal(err)
	}
	send("first", pay)
	send("replay", pay)
	send("mismatch", call{method: "POST", path: "/pay", key: key, tenant: tenant, body: `{"amount":5}`})
	slow := call{method: "POST", path: "/slow", key: key, tenant: e.tenant("slow"), body: payBody}
	done := make(chan *result, 1)
	go func() {
		r, err := e.send(slow)
		seen("slow", r, err)
		done <- r
	}()
	if !g.waitEntered(waitTimeout) {
		t.Fatal("slow handler never started")
	}
	send("in flight", slow)
	g.Open()
	<-done
	for _, path := range []string{"/panic", "/panic-error"} {
		if r := send(path, call{method: "POST", path: path, key: key, tenant: e.tenant(path), body: payBody}); r != nil {
			requireProblem(t, r, http.StatusInternalServerError, problem.HandlerPanic)
		}
	}
	send("flush-panic", call{method: "POST", path: "/flush-panic", key: key, tenant: e.tenant("flush"), body: payBody})
	// The scope function fails naming the key.
	scfg := cfg
	scfg.ScopeErr = fmt.Errorf("idemtest: %s", keyText("no session", s.Key))
	if err := e.startConfig(scfg, routes, nil, opts...); err != nil {
		t.Fatal(err)
	}
	send("scope error", pay)
	// A handler error naming the key: what idem logs and observes is
	// checked; the framework's log is not, since the handler itself handed
	// the framework that text.
	if !e.adapter.NoHandlerErrors {
		hcfg := Config{ErrorHandlerSaw: c.Err, HandlerError: fmt.Errorf("idemtest: %s", keyText("handler failed", s.Key))}
		if err := e.startConfig(hcfg, routes, nil, opts...); err != nil {
			t.Fatal(err)
		}
		// Its response is the framework's rendering of the handler's own
		// error (fiber's default error handler sends the message): not
		// idem's either.
		if _, err := e.send(call{method: "POST", path: "/pay", key: key, tenant: e.tenant("herr"), body: payBody}); err != nil {
			t.Errorf("handler error: %v", err)
		}
	}

	c.NoKey(t, s.Key)
	out := c.String()
	// The checks above must have looked at something.
	if !strings.Contains(out, "idem: abort_cause") || !strings.Contains(out, "handler panicked") {
		t.Errorf("the panics were not logged; the test proves nothing:\n%s", trunc([]byte(out)))
	}
	if !strings.Contains(out, core.RedactKey(s.Key)) {
		t.Errorf("the key's redacted form %s is nowhere: the paths did not run", core.RedactKey(s.Key))
	}
	if e.adapter.FrameworkLog && fw.String() == "" {
		t.Errorf("the framework's logger wrote nothing (Config.Log not honoured)")
	}
}
