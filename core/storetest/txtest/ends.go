package txtest

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// end is one way a handler ends the lease's transaction itself.
type end struct {
	name   string
	commit bool // its writes land
	sql    bool // sent as SQL, unseen by the transaction object
	do     func(ctx context.Context, tx Tx) error
}

func ends(h *Harness) []end {
	var out []end
	if h.TxOwned == nil {
		out = append(out,
			end{"Commit", true, false, func(ctx context.Context, tx Tx) error { return tx.Commit(ctx) }},
			end{"Rollback", false, false, func(ctx context.Context, tx Tx) error { return tx.Rollback(ctx) }})
	}
	for _, qs := range []struct {
		commit bool
		list   []string
	}{{true, h.SQLCommits}, {false, h.SQLRollbacks}} {
		for _, q := range qs.list {
			out = append(out, end{"SQL_" + q, qs.commit, true, func(ctx context.Context, tx Tx) error { return tx.Exec(ctx, q) }})
		}
	}
	return out
}

// endCases: the handler ends the transaction itself (through the object
// where the store lets it, with SQL) and then its execution goes on:
// Complete, Fail, deferred statements, a write after the end, a crash.
// Whatever the way, the money invariant holds: writes that landed are
// never run again (the key is not released over them), and a response is
// recorded only for writes that landed.
func endCases(h *Harness) []testCase {
	var out []testCase
	for _, e := range ends(h) {
		add := func(then string, fn func(r *run, e end)) {
			out = append(out, testCase{"Ends/" + e.name + "/" + then, func(r *run) { fn(r, e) }})
		}
		add("Complete", testEndThenComplete)
		add("Fail", testEndThenFail)
		add("CompleteWithDeferred", testEndThenDeferred)
		if e.commit {
			add("RefusedDeferred", testEndThenRefusedDeferred)
		}
		if e.sql {
			add("WriteThenComplete", func(r *run, e end) { testEndThenWrite(r, e, true) })
			add("WriteThenFail", func(r *run, e end) { testEndThenWrite(r, e, false) })
		}
		if h.CommitMarks {
			add("ProcessDies", testEndThenDie)
			if e.commit {
				for _, then := range []string{"Complete", "Fail", "DeferredComplete"} {
					add("EndFails/"+then, func(r *run, e end) { testEndThenEndFails(r, e, then) })
				}
			}
		}
	}
	return out
}

// ended claims "k", writes the handler's row in the transaction and ends
// it the way e does.
func (r *run) ended(e end) (context.Context, storekit.Fence) {
	r.Helper()
	ctx, f := r.claim("k", time.Hour)
	r.mustBook(ctx, f)
	must(r.T, e.name, e.do(ctx, r.tx(ctx)))
	return ctx, f
}

// sqlRollbackReleases: after a ROLLBACK sent as SQL the store releases the
// key (it answers storekit.ErrNotCommitted).
func (r *run) sqlRollbackReleases() bool {
	return errors.Is(r.h.SQLRollbackErr, storekit.ErrNotCommitted)
}

// wantRolledBack checks the record of a handler whose writes rolled back
// the way e did and that then completed (err: what Complete returned) or
// failed (err nil).
func (r *run) wantRolledBack(e end, completed bool, err error) {
	r.Helper()
	r.wantOwners("k")
	switch {
	case !e.sql || r.sqlRollbackReleases():
		if completed {
			wantErr(r.T, "Complete after "+e.name, err, storekit.ErrNotCommitted)
		}
		r.wantReleased("k")
	default:
		if completed {
			wantErr(r.T, "Complete after "+e.name, err, r.h.SQLRollbackErr)
		}
		r.wantNotRetained("k")
	}
}

// testEndThenComplete: committed, the response is recorded on its own;
// rolled back, it is refused (ErrNotCommitted) and the key released, or,
// after a ROLLBACK in SQL on a store that cannot see later statements,
// completed as not retained (SQLRollbackErr).
func testEndThenComplete(r *run, e end) {
	ctx, f := r.ended(e)
	err := r.e.Store.Complete(ctx, f, body("ok"))
	if e.commit {
		must(r.T, "Complete after "+e.name, err)
		r.wantOwners("k", f.Token)
		r.wantCompleted("k", "ok")
		r.wantRetry("k", false)
	} else {
		r.wantRolledBack(e, true, err)
	}
	r.wantIdle()
}

// testEndThenFail: committed, the key is not released (a retry would run
// the writes again): completed as not retained; rolled back, released.
func testEndThenFail(r *run, e end) {
	ctx, f := r.ended(e)
	must(r.T, "Fail after "+e.name, r.e.Store.Fail(ctx, f))
	if e.commit {
		r.wantOwners("k", f.Token)
		r.wantNotRetained("k")
	} else {
		r.wantRolledBack(e, false, nil)
	}
	r.wantIdle()
}

// testEndThenDeferred: deferred statements, queued before and after the
// handler ended the transaction, commit with the response (in order, in a
// transaction of their own) only if the handler's writes did.
func testEndThenDeferred(r *run, e end) {
	ctx, f := r.claim("k", time.Hour)
	r.mustBook(ctx, f)
	if err := r.deferRow(ctx, "d"); err != nil {
		r.Fatalf("Defer: %v", err)
	}
	must(r.T, e.name, e.do(ctx, r.tx(ctx)))
	r.mustDefer(ctx, "UPDATE "+r.e.Ledger+" SET owner = -owner WHERE k = ?", "d")
	err := r.e.Store.Complete(ctx, f, body("ok"))
	if e.commit {
		must(r.T, "Complete after "+e.name, err)
		r.wantOwners("k", f.Token)
		r.wantOwners("d", -f.Token)
		r.wantCompleted("k", "ok")
	} else {
		r.wantOwners("d")
		r.wantRolledBack(e, true, err)
	}
	r.wantIdle()
}

// testEndThenRefusedDeferred: the handler committed, then a deferred
// statement is refused: Complete fails, but not with ErrNotCommitted (the
// writes landed), and the key is not released: completed as not retained.
func testEndThenRefusedDeferred(r *run, e end) {
	ctx, f := r.ended(e)
	r.mustDefer(ctx, r.refused())
	err := r.e.Store.Complete(ctx, f, body("ok"))
	r.wantOwners("k", f.Token)
	if e.sql && r.h.SQLCommitUnseen {
		// Its response landed in autocommit before the refusal: recorded,
		// and never released.
		if err == nil || r.record("k").Status != storekit.StatusCompleted {
			r.Fatalf("Complete = %v, record %s; Harness.SQLCommitUnseen states an error, completed", err, r.record("k").Status)
		}
		r.wantRetry("k", false)
		return
	}
	if err == nil || errors.Is(err, storekit.ErrNotCommitted) {
		r.Fatalf("Complete = %v; want an error, not ErrNotCommitted: the handler's writes landed", err)
	}
	r.wantNotRetained("k")
	r.wantIdle()
}

// testEndThenWrite: after ending the transaction with SQL the handler
// writes on it again. The write is refused (RefusesAfterSQLEnd), or it may
// have autocommitted: whatever landed, the key is never released over it.
func testEndThenWrite(r *run, e end, complete bool) {
	ctx, f := r.ended(e)
	err := r.book(ctx, "k", -f.Token)
	if r.h.RefusesAfterSQLEnd && err == nil && !strings.Contains(strings.ToUpper(e.name), "AND CHAIN") {
		r.Errorf("a write after %s was accepted (it would run outside the transaction)", e.name)
	}
	if complete {
		err = r.e.Store.Complete(ctx, f, body("ok"))
	} else {
		err = r.e.Store.Fail(ctx, f)
	}
	rows := r.owners("k")
	rec := r.record("k")
	switch {
	case e.commit || r.h.RefusesAfterSQLEnd:
	case r.h.ReleasesAfterSQLRollbackWrites:
		if len(rows) != 1 || rec.Status != storekit.StatusFailed {
			r.Fatalf("after %s and a write: ledger %v, record %s; Harness.ReleasesAfterSQLRollbackWrites states one row, released", e.name, rows, rec.Status)
		}
		r.wantIdle()
		return
	case r.sqlRollbackReleases():
		if len(rows) > 0 {
			r.Fatalf("after %s, a write autocommitted (ledger %v), and the store releases the key", e.name, rows)
		}
	default: // completed as not retained, whatever autocommitted
		if complete {
			wantErr(r.T, "Complete after "+e.name+" and a write", err, r.h.SQLRollbackErr)
		} else {
			must(r.T, "Fail after "+e.name+" and a write", err)
		}
		r.wantNotRetained("k")
	}
	switch {
	case len(rows) > 0 && rec.Status != storekit.StatusCompleted:
		r.Fatalf("after %s and a write: ledger %v, record %s (%v); the key is released over writes that landed: a retry runs them again", e.name, rows, rec.Status, err)
	case len(rows) > 0:
		r.wantRetry("k", false)
	case complete && err == nil:
		r.Fatalf("after %s and a write: Complete recorded the response, but no write landed", e.name)
	}
	r.wantIdle()
}

// testEndThenDie: the handler ended the transaction and its process died
// before Complete; when the lease lapses, a retry runs the handler again
// only if its writes rolled back: after a commit the claim finds the
// commit mark and completes the record as not retained (500).
func testEndThenDie(r *run, e end) {
	_, f := r.ended(e)
	r.e.Lapse(r.T, scope, "k")
	res, err := r.e.Store.Claim(r.Context(), claimReq("k", time.Hour))
	must(r.T, "claim after the lapse", err)
	if !e.commit {
		if !res.Claimed || res.Record.Token <= f.Token {
			r.Fatalf("the writes rolled back, want a takeover: claimed %v, token %d", res.Claimed, res.Record.Token)
		}
		r.lease(r.e.Store, storekit.Fence{Scope: scope, Key: "k", Token: res.Record.Token})
		return
	}
	rec := res.Record
	if res.Claimed || rec.Status != storekit.StatusCompleted || rec.Token != f.Token || rec.Response == nil ||
		rec.Response.Status != 500 || !rec.Response.NotRetained {
		r.Fatalf("claim after a committed handler died: claimed %v, %s token %d response %+v; want completed under token %d, 500 not retained (the handler would run twice)",
			res.Claimed, rec.Status, rec.Token, rec.Response, f.Token)
	}
	r.wantOwners("k", f.Token)
	r.wantRetry("k", false)
}

// testEndThenEndFails: the handler committed, then the Complete or Fail
// that would end its record fails (the database refuses the record's
// write). The commit mark must stay, so that the claim that takes the
// lapsed lease over completes the record as not retained instead of running
// the handler again; a deferred statement never runs.
func testEndThenEndFails(r *run, e end, then string) {
	ctx, f := r.ended(e)
	if then == "DeferredComplete" {
		r.mustDefer(ctx, "UPDATE "+r.e.Ledger+" SET owner = -owner WHERE k = ?", "k")
	}
	undo := r.e.Refuse(r.T, "k")
	var err error
	if then == "Fail" {
		err = r.e.Store.Fail(ctx, f)
	} else {
		err = r.e.Store.Complete(ctx, f, body("ok"))
	}
	undo()
	if err == nil || errors.Is(err, storekit.ErrLeaseLost) {
		r.Fatalf("%s = %v, want the refused write", then, err)
	}
	r.wantMarks(1)
	if rec := r.record("k"); rec.Status != storekit.StatusProcessing {
		r.Fatalf("record %s, want processing", rec.Status)
	}
	r.e.Lapse(r.T, scope, "k")
	res, err := r.e.Store.Claim(r.Context(), claimReq("k", time.Hour))
	if err != nil || res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil || !res.Record.Response.NotRetained {
		r.Fatalf("takeover = %+v, %v; want no claim, completed as not retained", res, err)
	}
	r.wantOwners("k", f.Token)
}
