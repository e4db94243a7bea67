package txtest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/storekit"
)

// Failure is a real failure of a store's database, for RunSentinel.
type Failure struct {
	Name string
	// Signs: text of which the captured output must hold one, proof that
	// the real failure happened (a SQLSTATE, a driver's message).
	Signs []string
	// Open returns a fresh store this failure can hit (the driver's own
	// log, if it has one, goes to log), and during, which runs op while
	// the failure holds on the record of key (a lock held elsewhere and
	// the store's connection killed, a timeout, a trigger refusing the
	// record's write with key in its message) and returns op's error.
	Open func(t *testing.T, log io.Writer) (s storekit.Store, during func(key string, op func() error) error)
}

// Sentinel is what RunSentinel drives.
type Sentinel struct {
	Failures []Failure
	// Handler, if set, runs as the handler does before the commit, with the
	// handler's context (a statement in the lease's transaction).
	Handler func(ctx context.Context) error
}

// RunSentinel drives each of idemtest.SentinelKeys the store accepts (1 to
// 255 bytes, quotes, backslashes) into each failure, through the engine:
// the commit fails, then the retry's claim does. Nothing the engine logs
// (as text and as JSON), observes, returns or answers may carry the key in
// any form (idemtest.KeyLeaks); the database's own error, when it names the
// key, must come out scrubbed.
func RunSentinel(t *testing.T, sn Sentinel) {
	for _, k := range idemtest.SentinelKeys() {
		if !k.Valid {
			continue
		}
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			for _, f := range sn.Failures {
				t.Run(f.Name, func(t *testing.T) { sentinel(t, sn, f, k.Key) })
			}
		})
	}
}

func sentinel(t *testing.T, sn Sentinel, fl Failure, key string) {
	var c idemtest.Capture
	s, during := fl.Open(t, c.Writer())
	opts := slog.HandlerOptions{Level: slog.LevelDebug}
	log := slog.New(teeHandler{slog.NewTextHandler(c.Writer(), &opts), slog.NewJSONHandler(c.Writer(), &opts)})
	eng, err := core.New(s, core.WithLogger(log), core.WithObserver(func(ev core.Event) { c.Err(ev.Err) }),
		core.WithLease(time.Minute), core.WithScope(func(context.Context, *core.Request) (string, error) { return scope, nil }))
	must(t, "core.New", err)
	ctx := t.Context()
	request := func() core.Request {
		return core.Request{Method: "POST", Route: "/pay", Target: "/pay", Body: strings.NewReader(`{"amount":1}`),
			Header: http.Header{"Idempotency-Key": {idemtest.HeaderValue(key)}}}
	}
	fails := func(what string, op func() error) {
		t.Helper()
		err := during(key, op)
		if err == nil {
			t.Fatalf("%s succeeded through %s", what, fl.Name)
		}
		c.Err(err)
	}

	d, err := eng.Decide(ctx, request())
	if err != nil || d.Outcome != core.Proceed {
		t.Fatalf("decide: %v %v", d.Outcome, err)
	}
	if sn.Handler != nil {
		must(t, "handler", sn.Handler(d.Context(ctx)))
	}
	fails("commit", func() error {
		err := eng.Commit(ctx, d, adapterkit.Response{Status: 201, Body: []byte(`{"id":1}`)})
		if err != nil {
			c.Text(err.Error()) // the answer's body is fixed text; the error reaches error handlers
		}
		return err
	})
	// The retry's claim fails the same way; a record the failed commit
	// left processing under a live lease is released first.
	if rec, err := s.Get(ctx, scope, key); err == nil && rec.Status == storekit.StatusProcessing {
		must(t, "release", s.Fail(ctx, storekit.Fence{Scope: scope, Key: key, Token: rec.Token}))
	}
	fails("claim", func() error {
		d, err := eng.Decide(ctx, request())
		if d != nil && d.Response != nil {
			c.Text(string(d.Response.Body))
		}
		return err
	})

	out := c.String()
	seen := false
	for _, sign := range fl.Signs {
		seen = seen || strings.Contains(out, sign)
	}
	if !seen {
		t.Errorf("no real %s error (%q) was seen: the test proves nothing:\n%.2000s", fl.Name, fl.Signs, out)
	}
	if !strings.Contains(out, core.RedactKey(key)) {
		t.Errorf("the key's redacted form is nowhere: the engine logged nothing about it")
	}
	c.NoKey(t, key)
	if testing.Verbose() {
		t.Logf("%.600s", out)
	}
}

// WhileLocked runs op while lock's lock is held (lock returns its release)
// and returns op's error. With kill set, it calls kill once op is under way
// (kill waits for the store's statement to reach the database and ends its
// connection); otherwise op must fail by itself (a lock timeout).
func WhileLocked(t *testing.T, lock func() (unlock func()), kill func() error, op func() error) error {
	t.Helper()
	unlock, held := lock(), true
	release := func() {
		if held {
			held = false
			unlock()
		}
	}
	defer release()
	done := make(chan error, 1)
	go func() { done <- op() }()
	if kill != nil {
		if err := kill(); err != nil {
			release() // op may go on, and end
			t.Errorf("kill: %v", err)
		}
	}
	return <-done
}

// teeHandler logs each record through every handler it holds.
type teeHandler []slog.Handler

func (hs teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range hs {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (hs teeHandler) Handle(ctx context.Context, r slog.Record) error {
	for _, h := range hs {
		if err := h.Handle(ctx, r.Clone()); err != nil {
			return err
		}
	}
	return nil
}

func (hs teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make(teeHandler, len(hs))
	for i, h := range hs {
		out[i] = h.WithAttrs(as)
	}
	return out
}

func (hs teeHandler) WithGroup(name string) slog.Handler {
	out := make(teeHandler, len(hs))
	for i, h := range hs {
		out[i] = h.WithGroup(name)
	}
	return out
}
