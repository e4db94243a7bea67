package txtest

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

var txCases = []testCase{
	{"Tx/CommitsWithRecord", testTxCommitsWithRecord},
	{"Tx/FailRollsBack", testTxFailRollsBack},
	{"Tx/Refusals", testTxRefusals},
	{"Tx/ThroughDecorator", testTxThroughDecorator},
	{"Tx/StaleOwnerWritesVanish", testTxStaleOwner},
	{"Tx/LapsedOwnerCommitsBeforeTakeover", testTxLapsedOwnerCommits},
	{"Tx/HeartbeatWhileOpen", testTxHeartbeatWhileOpen},
	{"Tx/OutlivesRequestContext", testTxOutlivesRequest},
	{"Tx/Savepoint", testTxSavepoint},
}

// testTxCommitsWithRecord: the handler's writes commit at Complete, in
// one transaction with the stored response, not before; Tx twice is one
// transaction; after Complete Tx refuses and no connection is held.
func testTxCommitsWithRecord(r *run) {
	ctx, f := r.claim("k", time.Minute)
	tx1, tx2 := r.tx(ctx), r.tx(ctx)
	if tx1 != tx2 {
		r.Fatal("Tx twice returned different transactions")
	}
	r.mustBook(ctx, f)
	if r.h.TxOwned != nil {
		wantErr(r.T, "the handler's Commit", tx1.Commit(ctx), r.h.TxOwned)
		// A *sql.Tx answers later calls itself (sql.ErrTxDone).
		if err := tx1.Rollback(ctx); !errors.Is(err, r.h.TxOwned) && !errors.Is(err, sql.ErrTxDone) {
			r.Fatalf("the handler's Rollback = %v, want %v", err, r.h.TxOwned)
		}
	}
	r.wantOwners("k") // not visible outside the transaction
	must(r.T, "Complete", r.e.Store.Complete(ctx, f, body("ok")))
	r.wantOwners("k", f.Token)
	r.wantCompleted("k", "ok")
	_, err := r.h.Tx(ctx)
	wantErr(r.T, "Tx after Complete", err, r.h.ErrLeaseFinished)
	r.wantIdle()
}

// testTxFailRollsBack: Fail rolls the handler's writes back and releases
// the key; the retry's writes land.
func testTxFailRollsBack(r *run) {
	ctx, f := r.claim("k", time.Minute)
	r.mustBook(ctx, f)
	must(r.T, "Fail", r.e.Store.Fail(ctx, f))
	r.wantOwners("k")
	if rec := r.record("k"); rec.Status != storekit.StatusFailed {
		r.Fatalf("record %s after Fail, want failed", rec.Status)
	}
	_, err := r.h.Tx(ctx)
	wantErr(r.T, "Tx after Fail", err, r.h.ErrLeaseFinished)
	r.wantIdle()
	ctx2, f2 := r.claim("k", time.Minute)
	r.mustBook(ctx2, f2)
	must(r.T, "Complete (retry)", r.e.Store.Complete(ctx2, f2, body("retry")))
	r.wantOwners("k", f2.Token)
}

// testTxRefusals: Tx without a lease, and with a lease another store
// granted.
func testTxRefusals(r *run) {
	_, err := r.h.Tx(context.Background())
	wantErr(r.T, "Tx without a lease", err, r.h.ErrNoLease)
	foreign := storetest.ContextWithLease(context.Background(), storetest.NewLease(foreignStore{}, storekit.Fence{Key: "k"}))
	if _, err := r.h.Tx(foreign); err == nil {
		r.Fatal("Tx with a foreign store's lease succeeded")
	}
}

// testTxThroughDecorator: an engine whose store is a decorator around the
// store still gets its transaction, and the decorator's Complete commits it.
func testTxThroughDecorator(r *run) {
	d := decorator{r.e.Store}
	req := claimReq("k", time.Minute)
	res, err := d.Claim(r.Context(), req)
	if err != nil || !res.Claimed {
		r.Fatalf("claim: %+v, %v", res, err)
	}
	f := storekit.Fence{Scope: scope, Key: "k", Token: res.Record.Token}
	ctx := r.lease(d, f)
	r.mustBook(ctx, f)
	must(r.T, "Complete through the decorator", d.Complete(ctx, f, body("ok")))
	r.wantOwners("k", f.Token)
	r.wantIdle()
}

// testTxStaleOwner: the owner's lease lapses and a retry takes the key
// over; the stale owner's Complete fails with ErrLeaseLost and its writes
// vanish; the new owner's land.
func testTxStaleOwner(r *run) {
	staleCtx, stale := r.claim("k", time.Minute)
	if !r.h.TakeoverWaitsForTx {
		r.mustBook(staleCtx, stale)
	}
	r.e.Lapse(r.T, scope, "k")
	newCtx, fresh := r.claim("k", time.Minute)
	if fresh.Token <= stale.Token {
		r.Fatalf("takeover token %d not above %d", fresh.Token, stale.Token)
	}
	if r.h.TakeoverWaitsForTx {
		r.mustBook(staleCtx, stale) // its transaction begins after the takeover
	} else {
		r.mustBook(newCtx, fresh)
	}
	wantErr(r.T, "the stale owner's Complete", r.e.Store.Complete(staleCtx, stale, body("stale")), storekit.ErrLeaseLost)
	if r.h.TakeoverWaitsForTx {
		r.mustBook(newCtx, fresh)
	}
	must(r.T, "the new owner's Complete", r.e.Store.Complete(newCtx, fresh, body("new")))
	r.wantOwners("k", fresh.Token)
	r.wantCompleted("k", "new")
	r.wantIdle()
}

// testTxLapsedOwnerCommits: the owner's lease lapsed but nobody took over:
// it still owns the record and commits; a late claim replays.
func testTxLapsedOwnerCommits(r *run) {
	ctx, f := r.claim("k", time.Minute)
	r.e.Lapse(r.T, scope, "k")
	r.mustBook(ctx, f)
	must(r.T, "Complete after the lapse", r.e.Store.Complete(ctx, f, body("ok")))
	r.wantOwners("k", f.Token)
	r.wantCompleted("k", "ok")
	r.wantRetry("k", false)
}

// testTxHeartbeatWhileOpen: the execution's own heartbeat, with its
// transaction holding writes, neither waits for a lock that transaction
// holds nor disturbs it.
func testTxHeartbeatWhileOpen(r *run) {
	ctx, f := r.claim("k", time.Minute)
	r.mustBook(ctx, f)
	// Well below the stores' lock waits (SQLite's busy_timeout is 10s).
	hctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	must(r.T, "Heartbeat with the transaction open", r.e.Store.Heartbeat(hctx, f, time.Minute))
	must(r.T, "Complete", r.e.Store.Complete(ctx, f, body("ok")))
	r.wantOwners("k", f.Token)
	r.wantCompleted("k", "ok")
}

// testTxOutlivesRequest: the request's context ends (the client went away)
// after the handler wrote and before the engine commits, on a context
// without its cancellation: the transaction is still there.
func testTxOutlivesRequest(r *run) {
	req := claimReq("k", time.Minute)
	res, err := r.e.Store.Claim(r.Context(), req)
	if err != nil || !res.Claimed {
		r.Fatalf("claim: %+v, %v", res, err)
	}
	f := storekit.Fence{Scope: scope, Key: "k", Token: res.Record.Token}
	l := storetest.NewLease(r.e.Store, f)
	rctx, cancel := context.WithCancel(r.Context())
	hctx := storetest.ContextWithLease(rctx, l)
	r.Cleanup(func() { _ = r.e.Store.Fail(context.WithoutCancel(hctx), f) })
	r.mustBook(hctx, f)
	cancel()
	// database/sql rolls a transaction bound to a cancelled context back
	// from a goroutine of its own: give it the time to, were it so bound.
	time.Sleep(50 * time.Millisecond)
	cctx := storetest.ContextWithLease(context.WithoutCancel(rctx), l)
	must(r.T, "Complete", r.e.Store.Complete(cctx, f, body("ok")))
	r.wantOwners("k", f.Token)
	r.wantIdle()
}

// testTxSavepoint: a ROLLBACK TO SAVEPOINT ends nothing: Complete commits
// the writes before the savepoint with the response.
func testTxSavepoint(r *run) {
	ctx, f := r.claim("k", time.Minute)
	r.mustBook(ctx, f)
	tx := r.tx(ctx)
	for _, q := range []string{"SAVEPOINT a", "INSERT INTO " + r.e.Ledger + " (k, owner) VALUES ('k', -1)", "ROLLBACK TO SAVEPOINT a"} {
		must(r.T, q, tx.Exec(ctx, q))
	}
	must(r.T, "Complete", r.e.Store.Complete(ctx, f, body("ok")))
	r.wantOwners("k", f.Token)
	r.wantCompleted("k", "ok")
	r.wantIdle()
}
