package otelidem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/storekit"
)

// keyedErrors fails the calls named in fail with errors carrying the key
// the ways careless code writes one (%q, raw, JSON).
type keyedErrors struct {
	core.Store
	fail map[string]bool
}

func keyErr(op, key string) error {
	j, _ := json.Marshal(key)
	return fmt.Errorf("%s failed for key %q (raw: %s; json: %s)", op, key, key, j)
}

func (s keyedErrors) Claim(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
	if s.fail["claim"] {
		return storekit.ClaimResult{}, keyErr("claim", r.Key)
	}
	return s.Store.Claim(ctx, r)
}

func (s keyedErrors) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	if s.fail["complete"] {
		return keyErr("complete", f.Key)
	}
	return s.Store.Complete(ctx, f, resp)
}

func (s keyedErrors) Fail(ctx context.Context, f storekit.Fence) error {
	if s.fail["fail"] {
		return keyErr("fail", f.Key)
	}
	return s.Store.Fail(ctx, f)
}

func (s keyedErrors) Heartbeat(ctx context.Context, f storekit.Fence, d time.Duration) error {
	if s.fail["heartbeat"] {
		return keyErr("heartbeat", f.Key)
	}
	return s.Store.Heartbeat(ctx, f, d)
}

func (s keyedErrors) Get(ctx context.Context, scope, key string) (storekit.Record, error) {
	if s.fail["get"] {
		return storekit.Record{}, keyErr("get", key)
	}
	return s.Store.Get(ctx, scope, key)
}

// TestSentinelKeys: store errors carrying a key of 1 to 255 bytes, with
// quotes and backslashes, in every form, never reach a span (attributes,
// events, status) or a metric attribute.
func TestSentinelKeys(t *testing.T) {
	for _, s := range idemtest.SentinelKeys() {
		if !s.Valid {
			continue
		}
		t.Run(s.Name, func(t *testing.T) {
			r := newRig(t)
			var c idemtest.Capture
			newEng := func(tenant string, fail ...string) *core.Engine {
				m := map[string]bool{}
				for _, f := range fail {
					m[f] = true
				}
				eng, err := core.New(r.tel.Store(keyedErrors{Store: r.mem, fail: m}), append(c.Options(),
					core.WithObserver(func(ev core.Event) { r.tel.Observer()(ev); c.Err(ev.Err) }),
					core.WithScope(func(context.Context, *core.Request) (string, error) { return tenant, nil }))...)
				if err != nil {
					t.Fatal(err)
				}
				return eng
			}
			ctx := context.Background()
			h := http.Header{"Idempotency-Key": {idemtest.HeaderValue(s.Key)}}
			request := func(route string) core.Request {
				return core.Request{Method: "POST", Route: route, Target: route, Header: h, Body: strings.NewReader("x")}
			}
			// Claim fails.
			_, err := newEng("t-claim", "claim").Decide(ctx, request("/claim"))
			c.Err(err)
			// Complete, then Fail, fail; Get fails.
			for i, fail := range [][]string{{"complete"}, {"fail"}, {"fail", "get"}} {
				tenant := fmt.Sprint("t", i)
				eng := newEng(tenant, fail...)
				d, err := eng.Decide(ctx, request(fmt.Sprint("/commit", i)))
				if err != nil || d.Outcome != core.Proceed {
					t.Fatalf("decide: %v %v", d.Outcome, err)
				}
				if i == 0 {
					c.Err(eng.Commit(ctx, d, adapterkit.Response{Status: 201}))
				} else {
					c.Err(eng.Abort(ctx, d, keyErr("handler", s.Key)))
				}
				if fail[len(fail)-1] == "get" {
					// The wrapper returns the store's error as it is (the
					// engine scrubs what it passes on); its span must not
					// carry it.
					_, _ = r.tel.Store(keyedErrors{Store: r.mem, fail: map[string]bool{"get": true}}).Get(ctx, tenant, s.Key)
				}
			}
			points, spans := r.collect(t), r.spans.Ended()
			var errSpans int
			for _, p := range points {
				c.Text(fmt.Sprintf("metric %s %v", p.name, p.attrs.ToSlice()))
			}
			for _, sp := range spans {
				c.Text(fmt.Sprintf("span %s %v status %q", sp.Name(), sp.Attributes(), sp.Status().Description))
				for _, e := range sp.Events() {
					c.Text(fmt.Sprintf("span %s event %s %v", sp.Name(), e.Name, e.Attributes))
				}
				if sp.Status().Description != "" {
					errSpans++
				}
			}
			if errSpans < 4 {
				t.Errorf("%d spans recorded an error, want at least 4 (claim, complete, fail, get): the test proves nothing", errSpans)
			}
			if !strings.Contains(c.String(), core.RedactKey(s.Key)) {
				t.Errorf("the redacted key is nowhere: the errors did not carry the key")
			}
			c.NoKey(t, s.Key)
		})
	}
}
