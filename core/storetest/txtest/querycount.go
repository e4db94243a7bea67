package txtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

// queryCounts runs the query-count script on an Env from h.Counted and
// checks each phase against h.Counts. The phases, in order (a name that
// recurs states one count for each run):
//
//   - warm-up, once per store and connection (a first claim checks the
//     schema; statements may be prepared at first use): "first claim",
//     "first heartbeat", "first complete", "first get", "claim and first
//     fail";
//   - plain: "claim (new key)", "claim (in flight)", "heartbeat", "fail",
//     "claim (takeover)", for a storekit.StepStore "first save step",
//     "save step", "first load steps", "load steps", then "complete",
//     "claim (replay)", "get";
//   - transactional: "first Tx" (the first lease's Tx), "insert in tx"
//     (the handler's first statement), "Tx again" (the same lease),
//     "complete in tx"; on another lease "Tx", "insert in tx", "fail in
//     tx";
//   - deferred: "Defer" then "complete with deferred"; "Tx", "Defer",
//     "complete in tx with deferred" (a transaction begun, no statement of
//     the handler's); "Defer" then "fail with deferred".
//
// Each of them claims a new key first ("claim (new key)").
func queryCounts(t *testing.T, h *Harness) {
	e, c := h.Counted(t)
	r := &run{T: t, h: h, e: e}
	s := e.Store
	ctx := t.Context()
	ran := map[string]bool{}
	phase := func(name string, fn func() error) {
		t.Helper()
		ran[name] = true
		c.Reset()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n, detail := c.Count()
		want, ok := h.Counts[name]
		switch {
		case !ok:
			t.Errorf("%s: %d (%s); Harness.Counts states no count for it", name, n, detail)
		case n != want:
			t.Errorf("%s: %d (%s), want %d", name, n, detail, want)
		}
	}
	var (
		f    storekit.Fence
		hctx context.Context
	)
	claim := func(name, key string) {
		t.Helper()
		phase(name, func() error {
			req := claimReq(key, time.Minute)
			res, err := s.Claim(ctx, req)
			if err == nil && !res.Claimed {
				err = fmt.Errorf("phase %s: not claimed: %s", name, res.Record.Status)
			}
			f = storekit.Fence{Scope: scope, Key: key, Token: res.Record.Token}
			hctx = r.lease(s, f)
			return err
		})
	}
	complete := func(name string) { phase(name, func() error { return s.Complete(hctx, f, body("x")) }) }
	fail := func(name string) { phase(name, func() error { return s.Fail(hctx, f) }) }
	get := func(name string) { phase(name, func() error { _, err := s.Get(ctx, scope, f.Key); return err }) }
	heartbeat := func(name string) { phase(name, func() error { return s.Heartbeat(ctx, f, time.Minute) }) }
	tx := func(name string) { phase(name, func() error { _, err := h.Tx(hctx); return err }) }
	insert := func() {
		phase("insert in tx", func() error {
			tx, err := h.Tx(hctx)
			if err != nil {
				return err
			}
			return tx.Exec(hctx, r.q("INSERT INTO "+e.Ledger+" (k, owner) VALUES (?, ?)"), f.Key, f.Token)
		})
	}
	deferRow := func() { phase("Defer", func() error { return r.deferRow(hctx, f.Key) }) }

	claim("first claim", "warm")
	heartbeat("first heartbeat")
	complete("first complete")
	get("first get")
	phase("claim and first fail", func() error {
		res, err := s.Claim(ctx, claimReq("warm2", time.Minute))
		if err != nil {
			return err
		}
		return s.Fail(ctx, storekit.Fence{Scope: scope, Key: "warm2", Token: res.Record.Token})
	})

	claim("claim (new key)", "k")
	phase("claim (in flight)", func() error { _, err := s.Claim(ctx, claimReq("k", time.Minute)); return err })
	heartbeat("heartbeat")
	fail("fail")
	phase("claim (takeover)", func() error {
		res, err := s.Claim(ctx, claimReq("k", time.Minute))
		if err == nil && !res.Claimed {
			err = fmt.Errorf("takeover did not claim: %s", res.Record.Status)
		}
		f.Token = res.Record.Token
		hctx = storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
		return err
	})
	if ss, ok := s.(storekit.StepStore); ok {
		phase("first save step", func() error { return ss.SaveStep(ctx, f, "charge", []byte("ch_1")) })
		phase("save step", func() error { return ss.SaveStep(ctx, f, "notify", []byte("n_1")) })
		phase("first load steps", func() error { _, err := ss.LoadSteps(ctx, f); return err })
		phase("load steps", func() error { _, err := ss.LoadSteps(ctx, f); return err })
	}
	complete("complete")
	phase("claim (replay)", func() error { _, err := s.Claim(ctx, claimReq("k", time.Minute)); return err })
	get("get")

	claim("claim (new key)", "tx")
	tx("first Tx")
	insert()
	tx("Tx again")
	complete("complete in tx")
	claim("claim (new key)", "tx-fail")
	tx("Tx")
	insert()
	fail("fail in tx")

	claim("claim (new key)", "defer")
	deferRow()
	complete("complete with deferred")
	claim("claim (new key)", "tx-defer")
	tx("Tx")
	deferRow()
	complete("complete in tx with deferred")
	claim("claim (new key)", "defer-fail")
	deferRow()
	fail("fail with deferred")

	for name := range h.Counts {
		if !ran[name] {
			t.Errorf("Harness.Counts states %q, a phase the script does not have", name)
		}
	}
	for key, want := range map[string]int{"tx": 1, "tx-fail": 0, "defer": 1, "tx-defer": 1, "defer-fail": 0} {
		if got := r.owners(key); len(got) != want {
			t.Errorf("ledger rows of %s: %v, want %d: only completed executions' writes land", key, got, want)
		}
	}
}
