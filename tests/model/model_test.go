package model

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idem/core/storekit"
)

// seq builds a sequential history (each call returns before the next).
func seq(calls ...Op) []Op {
	for i := range calls {
		calls[i].Call, calls[i].Return = int64(2*i), int64(2*i+1)
	}
	return calls
}

func claimOp(fp string, claimed, fresh bool, v View) Op {
	return Op{In: Input{Kind: Claim, FP: fp}, Out: Output{Res: OK, Claimed: claimed, Fresh: fresh, Rec: v}}
}

func op(in Input, out Output) Op { return Op{In: in, Out: out} }

var (
	proc = func(tok int64, fp string) View { return View{Status: storekit.StatusProcessing, Tok: tok, FP: fp} }
	done = func(tok int64, resp string) View {
		return View{Status: storekit.StatusCompleted, Tok: tok, FP: "A", Resp: resp}
	}
)

// TestModelRules pins the model's rules on small sequential histories:
// each "bad" one breaks one rule and must be rejected, each "ok" one is
// the same history obeying it.
func TestModelRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
		ops  []Op
	}{
		{"second claim while the first is live", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			claimOp("A", true, false, proc(2, "A")))},
		{"in-flight duplicate", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			claimOp("A", false, false, proc(1, "A")))},
		{"takeover after a lapse", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, false, proc(2, "A")))},
		{"takeover under a smaller token", false, seq(
			claimOp("A", true, true, proc(5, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, false, proc(4, "A")))},
		{"takeover reported fresh", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, true, proc(2, "A")))},
		{"fingerprint mismatch takes over", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("B", true, false, proc(2, "B")))},
		{"fingerprint mismatch answered with the record", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("B", false, false, proc(1, "A")))},
		{"heartbeat revives a lapsed lease nobody took", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			op(Input{Kind: Heartbeat, Tok: 1}, Output{}),
			claimOp("A", false, false, proc(1, "A")))},
		{"stale complete accepted", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, false, proc(2, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{}))},
		{"stale complete refused", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, false, proc(2, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{Res: LeaseLost}),
			op(Input{Kind: Get}, Output{Rec: proc(2, "A")}))},
		{"current owner refused", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{Res: LeaseLost}))},
		{"replay of another response", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{}),
			claimOp("A", false, false, done(1, "r2")))},
		{"replay", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{}),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", false, false, done(1, "r1")))},
		{"completed record claimed again", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{}),
			claimOp("A", true, false, proc(2, "A")))},
		{"new record after expiry", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{}),
			op(Input{Kind: Expire}, Output{}),
			op(Input{Kind: Get}, Output{Res: NotFound}),
			claimOp("B", true, true, proc(2, "B")))},
		{"token reused after expiry", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Expire}, Output{}),
			claimOp("A", true, true, proc(1, "A")))},
		{"steps returned to a takeover", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: SaveStep, Tok: 1, Step: 1, Val: "ch_1"}, Output{}),
			op(Input{Kind: Fail, Tok: 1}, Output{}),
			claimOp("A", true, false, proc(2, "A")),
			op(Input{Kind: LoadSteps, Tok: 2}, Output{Steps: Steps{1: "ch_1"}}))},
		{"steps lost at a takeover", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: SaveStep, Tok: 1, Step: 1, Val: "ch_1"}, Output{}),
			op(Input{Kind: Fail, Tok: 1}, Output{}),
			claimOp("A", true, false, proc(2, "A")),
			op(Input{Kind: LoadSteps, Tok: 2}, Output{}))},
		{"steps of the previous incarnation", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: SaveStep, Tok: 1, Step: 0, Val: "res_1"}, Output{}),
			op(Input{Kind: Expire}, Output{}),
			claimOp("A", true, true, proc(2, "A")),
			op(Input{Kind: LoadSteps, Tok: 2}, Output{Steps: Steps{0: "res_1"}}))},
		{"stale step saved", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, false, proc(2, "A")),
			op(Input{Kind: SaveStep, Tok: 1, Step: 0, Val: "x"}, Output{}))},
		{"release of a live lease refused", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Release, Tok: 1}, Output{Res: Refused}),
			op(Input{Kind: Release, Tok: 1, Live: true}, Output{}),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{Res: LeaseLost}))},
		{"release of a live lease without live", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Release, Tok: 1}, Output{}))},
		{"unknown claim seen later", true, seq(
			op(Input{Kind: Claim, FP: "A"}, Output{Res: Unknown}),
			op(Input{Kind: Get}, Output{Rec: proc(7, "A")}),
			claimOp("A", false, false, proc(7, "A")))},
		{"unknown complete with the store's fail (transactional)", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true}, Output{Res: Unknown}),
			op(Input{Kind: Get}, Output{Rec: View{Status: storekit.StatusFailed, Tok: 1, FP: "A"}}))},
		{"unknown plain complete cannot fail", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{Res: Unknown}),
			op(Input{Kind: Get}, Output{Rec: View{Status: storekit.StatusFailed, Tok: 1, FP: "A"}}))},
		{"response recorded without its business write", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true}, Output{}),
			op(Input{Kind: Audit}, Output{}))},
		{"response recorded with its business write", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true}, Output{}),
			op(Input{Kind: Audit}, Output{Ledger: "1"}))},
		{"business write of a refused complete kept", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Release, Tok: 1, Live: true}, Output{}),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true}, Output{Res: LeaseLost}),
			op(Input{Kind: Audit}, Output{Ledger: "1"}))},
		// The handler committed its transaction itself and crashed.
		{"crashed handler's committed writes: completed not retained", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1}, Output{}),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", false, false, View{Status: storekit.StatusCompleted, Tok: 1, FP: "A", Resp: NotRetainedResp}),
			op(Input{Kind: Audit}, Output{Ledger: "1"}))},
		{"crashed handler's committed writes: taken over", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1}, Output{}),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, false, proc(2, "A")))},
		{"crashed handler's committed writes: new again after expiry", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1}, Output{}),
			op(Input{Kind: Expire}, Output{}),
			claimOp("A", true, true, proc(2, "A")))},
		// The handler committed its transaction itself and went on
		// (Env.CommitThenFinish): idem's Complete and Fail follow, with no
		// business write of their own.
		{"handler's commit, then complete: response recorded", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1}, Output{}),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1"}, Output{}),
			op(Input{Kind: Get}, Output{Rec: done(1, "r1")}),
			op(Input{Kind: Audit}, Output{Ledger: "1"}))},
		{"handler's commit, then fail: completed not retained", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1}, Output{}),
			op(Input{Kind: Fail, Tok: 1}, Output{}),
			claimOp("A", false, false, View{Status: storekit.StatusCompleted, Tok: 1, FP: "A", Resp: NotRetainedResp}))},
		{"handler's commit, then fail: released, run again", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1}, Output{}),
			op(Input{Kind: Fail, Tok: 1}, Output{}),
			claimOp("A", true, false, proc(2, "A")))},
		{"handler's commit, then a refused fail: the record unchanged", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1}, Output{}),
			op(Input{Kind: Release, Tok: 1, Live: true}, Output{}),
			op(Input{Kind: Fail, Tok: 1}, Output{Res: LeaseLost}),
			op(Input{Kind: Get}, Output{Rec: View{Status: storekit.StatusFailed, Tok: 1, FP: "A"}}),
			op(Input{Kind: Audit}, Output{Ledger: "1"}))},
		// The same on a store without commit marks (Input.NoMark, pgstore):
		// Complete and Fail decide by whether the COMMIT landed, and a
		// takeover of the lapsed lease is not sealed.
		{"no mark: handler's commit, then fail: completed not retained", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1, NoMark: true}, Output{}),
			op(Input{Kind: Fail, Tok: 1, NoMark: true}, Output{}),
			claimOp("A", false, false, View{Status: storekit.StatusCompleted, Tok: 1, FP: "A", Resp: NotRetainedResp}))},
		{"no mark: handler's commit, then a complete that could not record: not retained", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1, NoMark: true}, Output{}),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", NoMark: true}, Output{Res: Unknown}),
			op(Input{Kind: Get}, Output{Rec: View{Status: storekit.StatusCompleted, Tok: 1, FP: "A", Resp: NotRetainedResp}}),
			op(Input{Kind: Audit}, Output{Ledger: "1"}))},
		{"no mark: handler's commit landed, then the key released", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1, NoMark: true}, Output{}),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", NoMark: true}, Output{Res: Unknown}),
			op(Input{Kind: Get}, Output{Rec: View{Status: storekit.StatusFailed, Tok: 1, FP: "A"}}))},
		{"no mark: handler's commit lost, then the key released", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1, NoMark: true}, Output{Res: Unknown}),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", NoMark: true}, Output{Res: Unknown}),
			op(Input{Kind: Get}, Output{Rec: View{Status: storekit.StatusFailed, Tok: 1, FP: "A"}}),
			op(Input{Kind: Audit}, Output{}))},
		{"no mark: handler's commit lost, response recorded anyway", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1, NoMark: true}, Output{Res: Unknown}),
			op(Input{Kind: Audit}, Output{}),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", NoMark: true}, Output{}))},
		{"no mark: a crashed handler's commit does not seal a takeover", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: CommitCrash, Tok: 1, NoMark: true}, Output{}),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, false, proc(2, "A")))},
		// The handler rolled its own transaction back (Input.Ended).
		{"handler's rollback: response refused, key released", true, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true, Ended: true}, Output{Res: NotCommitted}),
			op(Input{Kind: Audit}, Output{}),
			claimOp("A", true, false, proc(2, "A")))},
		{"handler's rollback: response recorded", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true, Ended: true}, Output{}))},
		{"handler's rollback: unknown outcome recorded the response", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true, Ended: true}, Output{Res: Unknown}),
			op(Input{Kind: Get}, Output{Rec: done(1, "r1")}))},
		{"not committed without a handler's rollback", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true}, Output{Res: NotCommitted}))},
		{"not committed, stale token: nothing released", false, seq(
			claimOp("A", true, true, proc(1, "A")),
			op(Input{Kind: Lapse}, Output{}),
			claimOp("A", true, false, proc(2, "A")),
			op(Input{Kind: Complete, Tok: 1, Resp: "r1", Tx: true, Ended: true}, Output{Res: NotCommitted}),
			op(Input{Kind: Get}, Output{Rec: View{Status: storekit.StatusFailed, Tok: 2, FP: "A"}}))},
	} {
		want := porcupine.Illegal
		if tc.ok {
			want = porcupine.Ok
		}
		if got, _ := Check(tc.ops, 10*time.Second); got != want {
			t.Errorf("%s: %s, want %s", tc.name, got, want)
		}
	}
}
