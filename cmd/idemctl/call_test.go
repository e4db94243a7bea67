package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// TestInspectCall: a record of core.Engine.Call is inspected like an HTTP
// one, as method CALL with the call's name as route.
func TestInspectCall(t *testing.T) { backends(t, testInspectCall) }

func testInspectCall(t *testing.T, c ctl, st core.Store) {
	e, err := core.New(st)
	if err != nil {
		t.Fatal(err)
	}
	key := "msg-" + sentinel
	if _, err := e.Call(context.Background(), core.CallRequest{Scope: "worker", Key: key, Name: "charge-payment", Input: []byte("42")},
		func(context.Context) ([]byte, error) { return []byte(`{"charge_id":"ch_1"}`), nil }); err != nil {
		t.Fatal(err)
	}
	var rec recordJSON
	c.json(&rec, "inspect", "-scope", "worker", key)
	if rec.Method != storekit.CallMethod || rec.Route != "charge-payment" || rec.Status != storekit.StatusCompleted ||
		rec.Response == nil || rec.Response.BodyBytes != 20 {
		t.Errorf("inspect of a call: %+v", rec)
	}
	if r := c.run("inspect", "-scope", "worker", key); r.code != exitOK || !strings.Contains(r.stdout, "CALL charge-payment") {
		t.Errorf("inspect (text): %d %s %s", r.code, r.stdout, r.stderr)
	}
}
