package core_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// TestDecideAsksLazily: an adapterkit.BodyBytes body is called only for a request
// idem protects once the method, route, key and scope checks pass, and
// Request.NoRoute only for a protected method; a request no route matches
// is a Bypass with nothing recorded, whatever its key.
func TestDecideAsksLazily(t *testing.T) {
	store := memstore.New()
	eng, err := core.New(store, core.WithMaxRequestBytes(8))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	noScope := func(context.Context, *core.Request) (string, error) { return "", errors.New("no session") }
	withScope := func(context.Context, *core.Request) (string, error) { return "u", nil }
	cases := []struct {
		name     string
		method   string
		key      string
		scope    core.ScopeFunc
		noRoute  bool
		want     core.Outcome
		problem  string
		body     bool // the BodyBytes called
		asked    bool // NoRoute called
		recorded int
	}{
		{"safe method", http.MethodGet, "k1", withScope, false, core.Bypass, "", false, false, 0},
		{"no route, no key", http.MethodPost, "", withScope, true, core.Bypass, "", false, true, 0},
		{"no route, a key", http.MethodPost, "k2", withScope, true, core.Bypass, "", false, true, 0},
		{"missing key", http.MethodPost, "", withScope, false, core.Reject, problem.MissingKey, false, true, 0},
		{"invalid key", http.MethodPost, "bad\x01key", withScope, false, core.Reject, problem.InvalidKey, false, true, 0},
		{"scope error", http.MethodPost, "k3", noScope, false, core.Reject, problem.ScopeUnavailable, false, true, 0},
		{"over the limit", http.MethodPost, "k4", withScope, false, core.Reject, problem.BodyTooLarge, true, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body, asked bool
			req := core.Request{Method: tc.method, Route: "/pay", Target: "/pay", ScopeFunc: tc.scope,
				Header:  http.Header{},
				Body:    adapterkit.BodyBytes(func() []byte { body = true; return []byte("0123456789") }),
				NoRoute: func() bool { asked = true; return tc.noRoute },
			}
			if tc.key != "" {
				req.Header.Set("Idempotency-Key", tc.key)
			}
			d, err := eng.Decide(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if d.Outcome != tc.want || d.Problem != tc.problem {
				t.Errorf("decision %v %q, want %v %q", d.Outcome, d.Problem, tc.want, tc.problem)
			}
			if body != tc.body || asked != tc.asked {
				t.Errorf("body read %v, route asked %v; want %v, %v", body, asked, tc.body, tc.asked)
			}
			if n := store.Len(); n != tc.recorded {
				t.Errorf("%d records, want %d", n, tc.recorded)
			}
		})
	}
	// Within the limit, the BodyBytes' bytes are the ones fingerprinted.
	req := core.Request{Method: http.MethodPost, Route: "/pay", Target: "/pay", Scope: "u",
		Header: http.Header{"Idempotency-Key": {"k5"}}, Body: adapterkit.BodyBytes(func() []byte { return []byte("abc") })}
	d, err := eng.Decide(ctx, req)
	if err != nil || d.Outcome != core.Proceed || d.BodyRead {
		t.Fatalf("decision %v %v BodyRead=%v, want proceed without a body to hand back", d.Outcome, err, d.BodyRead)
	}
	_ = eng.Abort(ctx, d, nil)
	rec, err := store.Get(ctx, "u", "k5")
	if err != nil {
		t.Fatal(err)
	}
	if want := core.Fingerprint(core.FingerprintInput{Method: http.MethodPost, Route: "/pay", Target: "/pay", Body: []byte("abc")}); rec.Fingerprint != want {
		t.Errorf("fingerprint %s, want %s (of the BodyBytes' bytes)", rec.Fingerprint, want)
	}
}
