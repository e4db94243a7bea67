package txtest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

var deferCases = []testCase{
	{"Defer/CommitsWithRecord", testDeferCommitsWithRecord},
	{"Defer/AfterTx", testDeferAfterTx},
	{"Defer/NotRunOnFail", testDeferNotRunOnFail},
	{"Defer/RefusedRollsBackEverything", func(r *run) { testDeferRefused(r, false) }},
	{"Defer/RefusedRollsBackEverythingAfterTx", func(r *run) { testDeferRefused(r, true) }},
	{"Defer/StaleOwnerWritesVanish", func(r *run) { testDeferStaleOwner(r, false) }},
	{"Defer/StaleOwnerWritesVanishAfterTx", func(r *run) { testDeferStaleOwner(r, true) }},
	{"Defer/Refusals", testDeferRefusals},
	{"Defer/ThroughEngine", testDeferThroughEngine},
}

// testDeferCommitsWithRecord: deferred statements run at Complete, in the
// order queued, in one transaction with the stored response. Before that
// nothing runs, no connection is held, and no lock either: another key is
// claimed and completed meanwhile. After Complete, Defer refuses.
func testDeferCommitsWithRecord(r *run) {
	ctx, f := r.claim("k", time.Minute)
	if err := r.deferRow(ctx, "k"); err != nil {
		r.Fatalf("Defer: %v", err)
	}
	// The second sees the first: order kept, one transaction.
	r.mustDefer(ctx, "UPDATE "+r.e.Ledger+" SET owner = owner * 10 WHERE k = ?", "k")
	r.wantOwners("k")
	if n := r.e.InUse(); n != 0 {
		r.Fatalf("Defer holds %d connections", n)
	}
	// Well below the stores' lock waits (SQLite's busy_timeout is 10s).
	octx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	other, err := r.e.Store.Claim(octx, claimReq("other", time.Minute))
	if err != nil || !other.Claimed {
		r.Fatalf("another key's claim while a deferred write is queued: claimed %v, %v", other.Claimed, err)
	}
	must(r.T, "another key's Complete", r.e.Store.Complete(octx, storekit.Fence{Scope: scope, Key: "other", Token: other.Record.Token}, body("other")))
	must(r.T, "Complete", r.e.Store.Complete(ctx, f, body("ok")))
	r.wantOwners("k", f.Token*10)
	r.wantCompleted("k", "ok")
	r.wantIdle()
	wantErr(r.T, "Defer after Complete", r.h.Defer(ctx, "SELECT 1"), r.h.ErrLeaseFinished)
}

// testDeferAfterTx: with a transaction begun through Tx, the deferred
// statements run in it, after the handler's, and commit with them.
func testDeferAfterTx(r *run) {
	ctx, f := r.claim("k", time.Minute)
	// Queued before the handler's row, run after it: it updates that row.
	r.mustDefer(ctx, "UPDATE "+r.e.Ledger+" SET owner = -owner WHERE k = ?", "k")
	r.mustBook(ctx, f)
	must(r.T, "Complete", r.e.Store.Complete(ctx, f, body("ok")))
	r.wantOwners("k", -f.Token)
	r.wantIdle()
}

// testDeferNotRunOnFail: a released key runs none of its deferred
// statements, Defer refuses after Fail, and the retry's own land.
func testDeferNotRunOnFail(r *run) {
	ctx, f := r.claim("k", time.Minute)
	if err := r.deferRow(ctx, "k"); err != nil {
		r.Fatal(err)
	}
	must(r.T, "Fail", r.e.Store.Fail(ctx, f))
	r.wantOwners("k")
	wantErr(r.T, "Defer after Fail", r.h.Defer(ctx, "SELECT 1"), r.h.ErrLeaseFinished)
	ctx2, f2 := r.claim("k", time.Minute)
	if err := r.deferRow(ctx2, "k"); err != nil {
		r.Fatal(err)
	}
	must(r.T, "Complete (retry)", r.e.Store.Complete(ctx2, f2, body("ok")))
	r.wantOwners("k", f2.Token)
}

// testDeferRefused: a deferred statement the database refuses rolls back
// the other deferred statements, the handler's writes and the response;
// Complete says so with ErrNotCommitted and releases the key, so that a
// retry runs at once (not after the hour's lease).
func testDeferRefused(r *run, withTx bool) {
	ctx, f := r.claim("k", time.Hour)
	if withTx {
		if err := r.book(ctx, "tx", f.Token); err != nil {
			r.Fatal(err)
		}
	}
	if err := r.deferRow(ctx, "k"); err != nil {
		r.Fatal(err)
	}
	r.mustDefer(ctx, r.refused())
	wantErr(r.T, "Complete", r.e.Store.Complete(ctx, f, body("never")), storekit.ErrNotCommitted)
	r.wantOwners("k")
	r.wantOwners("tx")
	r.wantOwners("refused")
	r.wantIdle()
	if rec := r.record("k"); rec.Status != storekit.StatusFailed {
		r.Fatalf("record %s, want failed (released)", rec.Status)
	}
	ctx2, f2 := r.claim("k", time.Minute)
	if err := r.deferRow(ctx2, "k"); err != nil {
		r.Fatal(err)
	}
	must(r.T, "Complete (retry)", r.e.Store.Complete(ctx2, f2, body("ok")))
	r.wantOwners("k", f2.Token)
}

// testDeferStaleOwner: an owner whose lease was taken over completes with
// ErrLeaseLost, and its deferred statements (and writes) never commit;
// they are not even sent: one the database would refuse does not turn the
// answer into ErrNotCommitted (unless Harness.DeferredBeforeFence). The
// new owner's land.
func testDeferStaleOwner(r *run, withTx bool) {
	staleCtx, stale := r.claim("k", time.Minute)
	if err := r.deferRow(staleCtx, "k"); err != nil {
		r.Fatal(err)
	}
	r.mustDefer(staleCtx, r.refused())
	if withTx && !r.h.TakeoverWaitsForTx {
		if err := r.book(staleCtx, "tx", stale.Token); err != nil {
			r.Fatal(err)
		}
	}
	r.e.Lapse(r.T, scope, "k")
	newCtx, fresh := r.claim("k", time.Minute)
	if err := r.deferRow(newCtx, "k"); err != nil {
		r.Fatal(err)
	}
	if withTx && r.h.TakeoverWaitsForTx {
		// Its transaction begins after the takeover, and holds the write
		// lock until its Complete.
		if err := r.book(staleCtx, "tx", stale.Token); err != nil {
			r.Fatal(err)
		}
	}
	err := r.e.Store.Complete(staleCtx, stale, body("stale"))
	switch {
	case r.h.DeferredBeforeFence:
		wantErr(r.T, "the stale owner's Complete (its refused deferred statement ran first)", err, storekit.ErrNotCommitted)
	case !errors.Is(err, storekit.ErrLeaseLost) || errors.Is(err, storekit.ErrNotCommitted):
		r.Fatalf("the stale owner's Complete = %v, want ErrLeaseLost only", err)
	}
	must(r.T, "the new owner's Complete", r.e.Store.Complete(newCtx, fresh, body("new")))
	r.wantOwners("k", fresh.Token)
	r.wantOwners("tx")
	r.wantCompleted("k", "new")
	r.wantIdle()
}

// testDeferRefusals: no lease, a foreign store's lease, a finished lease.
func testDeferRefusals(r *run) {
	wantErr(r.T, "Defer without a lease", r.h.Defer(context.Background(), "SELECT 1"), r.h.ErrNoLease)
	foreign := storetest.ContextWithLease(context.Background(), storetest.NewLease(foreignStore{}, storekit.Fence{Key: "k"}))
	if err := r.h.Defer(foreign, "SELECT 1"); err == nil {
		r.Fatal("Defer with a foreign store's lease succeeded")
	}
	ctx, f := r.claim("k", time.Minute)
	must(r.T, "Defer", r.h.Defer(ctx, "SELECT 1"))
	must(r.T, "Complete", r.e.Store.Complete(ctx, f, body("ok")))
	wantErr(r.T, "Defer after Complete", r.h.Defer(ctx, "SELECT 1"), r.h.ErrLeaseFinished)
}

// testDeferThroughEngine: through Engine.Call, a refused deferred statement
// fails the call with ErrNotCommitted and the next call runs fn again; a
// succeeding one commits exactly once however many callers race.
func testDeferThroughEngine(r *run) {
	e, err := core.New(r.e.Store)
	must(r.T, "core.New", err)
	req := core.CallRequest{Scope: scope, Key: "pay-1", Name: "charge", Input: []byte("42")}
	_, err = e.Call(r.Context(), req, func(ctx context.Context) ([]byte, error) {
		if err := r.deferRow(ctx, "pay-1"); err != nil {
			return nil, err
		}
		return []byte("booked"), r.h.Defer(ctx, r.refused())
	})
	wantErr(r.T, "a call with a refused deferred statement", err, storekit.ErrNotCommitted)
	r.wantOwners("pay-1")
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		tokens []int64
	)
	for range 8 {
		wg.Go(func() {
			out, err := e.Call(r.Context(), req, func(ctx context.Context) ([]byte, error) {
				l, _ := storekit.LeaseFromContext(ctx)
				mu.Lock()
				tokens = append(tokens, l.Fence().Token)
				mu.Unlock()
				return []byte("booked"), r.deferRow(ctx, "pay-1")
			})
			if err != nil && !errors.Is(err, core.ErrInFlight) {
				r.Errorf("call: %v", err)
			}
			if err == nil && string(out.Value) != "booked" {
				r.Errorf("call result %q", out.Value)
			}
		})
	}
	wg.Wait()
	got := r.owners("pay-1")
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !slices.Contains(tokens, got[0]) {
		r.Fatalf("ledger owners %v after runs with tokens %v, want exactly one of theirs", got, tokens)
	}
}
