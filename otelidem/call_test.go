package otelidem_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// TestCall: the records of core.Engine.Call show up as HTTP ones do, with
// method CALL and the call's name as route.
func TestCall(t *testing.T) {
	r := newRig(t)
	eng := r.engine(t)
	req := core.CallRequest{Scope: "tenant-" + sentinel, Key: "k-" + sentinel, Name: "charge", Input: []byte("42")}
	for range 2 {
		if _, err := eng.Call(context.Background(), req, func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	points := r.collect(t)
	route := attribute.String("http.route", "charge")
	for _, want := range []string{"claim", "replay"} {
		if n := sum(points, "idem.decisions", outcome(want), route); n != 1 {
			t.Errorf("idem.decisions{outcome=%s, route=charge} = %d, want 1", want, n)
		}
	}
	if n := sum(points, "idem.commits", outcome("commit"), route); n != 1 {
		t.Errorf("idem.commits{commit, route=charge} = %d, want 1", n)
	}
	claims := 0
	for _, s := range r.spans.Ended() {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), sentinel) {
				t.Errorf("span %s: attribute %s carries the key or scope", s.Name(), kv.Key)
			}
		}
		if s.Name() != "idem.claim" {
			continue
		}
		claims++
		attrs := attribute.NewSet(s.Attributes()...)
		if v, _ := attrs.Value("http.request.method"); v.AsString() != storekit.CallMethod {
			t.Errorf("claim span method %q, want %s", v.AsString(), storekit.CallMethod)
		}
		if v, _ := attrs.Value("http.route"); v.AsString() != "charge" {
			t.Errorf("claim span route %q, want charge", v.AsString())
		}
	}
	if claims != 2 {
		t.Errorf("%d claim spans, want 2", claims)
	}
}
