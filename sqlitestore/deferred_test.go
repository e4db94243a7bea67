package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

// deferRow queues the handler-equivalent's ledger row (owner: its token)
// with Defer.
func deferRow(ctx context.Context, key string) error {
	l, _ := storekit.LeaseFromContext(ctx)
	return Defer(ctx, "INSERT INTO ledger (k, owner) VALUES (?, ?)", key, l.Fence().Token)
}

// refusedStmt is a statement SQLite refuses: owner is NOT NULL.
const refusedStmt = "INSERT INTO ledger (k, owner) VALUES ('refused', NULL)"

// ledgerOwners returns the owner column of key's ledger rows.
func ledgerOwners(t *testing.T, db *sql.DB, key string) []int64 {
	t.Helper()
	rows, err := db.Query("SELECT owner FROM ledger WHERE k = ?", key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var owners []int64
	for rows.Next() {
		var o int64
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		owners = append(owners, o)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return owners
}

// TestDeferCommitsWithRecord: deferred statements run at Complete, in the
// order queued, in one transaction with the stored response; before that
// nothing runs, no connection is taken and SQLite's write lock is free
// (another key is claimed and completed meanwhile).
func TestDeferCommitsWithRecord(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := deferRow(hctx, "a"); err != nil {
		t.Fatalf("Defer: %v", err)
	}
	// The second statement sees the first: order is kept, in one
	// transaction.
	if err := Defer(hctx, "UPDATE ledger SET owner = owner * 10 WHERE k = ?", "a"); err != nil {
		t.Fatalf("Defer (second): %v", err)
	}
	if got := ledgerOwners(t, db, "a"); len(got) != 0 {
		t.Fatalf("deferred row visible before Complete: %v", got)
	}
	if n := db.Stats().InUse; n != 0 {
		t.Fatalf("Defer holds %d connections", n)
	}
	// Well below busy_timeout (10s): a write lock held since Defer would
	// keep this claim waiting past it.
	octx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	other, err := s.Claim(octx, claimReq("b", time.Minute))
	if err != nil || !other.Claimed {
		t.Fatalf("another key's claim while a deferred write is queued: %v (claimed %v)", err, other.Claimed)
	}
	of := storekit.Fence{Scope: "tenant", Key: "b", Token: other.Record.Token}
	if err := s.Complete(octx, of, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("another key's complete while a deferred write is queued: %v", err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if got := ledgerOwners(t, db, "a"); !slices.Equal(got, []int64{f.Token * 10}) {
		t.Fatalf("ledger after Complete = %v, want [%d]", got, f.Token*10)
	}
	if r := requireStatus(t, s, "a", storekit.StatusCompleted); r.Response == nil || string(r.Response.Body) != "ok" {
		t.Fatalf("stored response %+v", r.Response)
	}
	if n := db.Stats().InUse; n != 0 {
		t.Fatalf("%d connections still in use after Complete", n)
	}
	if err := Defer(hctx, "SELECT 1"); !errors.Is(err, ErrLeaseFinished) {
		t.Fatalf("Defer after Complete = %v, want ErrLeaseFinished", err)
	}
}

// TestDeferAfterTx: with a transaction begun through Tx, the deferred
// statements run in it, after the handler's statements, and commit with
// them and the record.
func TestDeferAfterTx(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	// Queued before the Tx statement, run after it: it updates that row.
	if err := Defer(hctx, "UPDATE ledger SET owner = -owner WHERE k = ?", "a"); err != nil {
		t.Fatal(err)
	}
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if got := ledgerOwners(t, db, "a"); !slices.Equal(got, []int64{-f.Token}) {
		t.Fatalf("ledger = %v, want [%d] (the Tx row, updated by the deferred statement)", got, -f.Token)
	}
	requireStatus(t, s, "a", storekit.StatusCompleted)
}

// TestDeferAfterHandlerCommitted: a handler that committed its Tx itself
// has its deferred statements run with the fenced complete, in a
// transaction of their own.
func TestDeferAfterHandlerCommitted(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	tx, _ := Tx(hctx)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := Defer(hctx, "UPDATE ledger SET owner = -owner WHERE k = ?", "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if got := ledgerOwners(t, db, "a"); !slices.Equal(got, []int64{-f.Token}) {
		t.Fatalf("ledger = %v, want [%d]", got, -f.Token)
	}
	requireStatus(t, s, "a", storekit.StatusCompleted)
}

// TestDeferFailsAfterHandlerCommitted: when the handler committed its Tx
// itself, a deferred statement that fails cannot take those writes back:
// the record is completed as not retained (as Fail does then) rather than
// released, so a retry does not run the handler's writes again.
func TestDeferFailsAfterHandlerCommitted(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	req := claimReq("a", time.Hour)
	hctx, f := handlerCtx(t, s, req)
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	tx, _ := Tx(hctx)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := Defer(hctx, refusedStmt); err != nil {
		t.Fatal(err)
	}
	// An error, but not ErrNotCommitted: the handler's writes did commit,
	// and the key is not released (mysqlstore answers the same).
	err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	if err == nil || errors.Is(err, storekit.ErrNotCommitted) {
		t.Fatalf("Complete = %v, want an error that is not ErrNotCommitted", err)
	}
	if got := ledgerOwners(t, db, "a"); !slices.Equal(got, []int64{f.Token}) {
		t.Fatalf("ledger = %v, want the handler's committed row [%d]", got, f.Token)
	}
	r := requireStatus(t, s, "a", storekit.StatusCompleted)
	if r.Response == nil || !r.Response.NotRetained {
		t.Fatalf("stored response %+v, want not retained", r.Response)
	}
	if res, err := s.Claim(t.Context(), req); err != nil || res.Claimed {
		t.Fatalf("retry: claimed %v, err %v; want the completed record", res.Claimed, err)
	}
}

// TestDeferNotRunOnFail: a released key runs none of its deferred
// statements, and its retry queues its own.
func TestDeferNotRunOnFail(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	req := claimReq("a", time.Minute)
	hctx, f := handlerCtx(t, s, req)
	if err := deferRow(hctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(hctx, f); err != nil {
		t.Fatalf("fail: %v", err)
	}
	if got := ledgerOwners(t, db, "a"); len(got) != 0 {
		t.Fatalf("ledger after Fail = %v, want none", got)
	}
	requireStatus(t, s, "a", storekit.StatusFailed)
	if err := Defer(hctx, "SELECT 1"); !errors.Is(err, ErrLeaseFinished) {
		t.Fatalf("Defer after Fail = %v, want ErrLeaseFinished", err)
	}
	hctx2, f2 := handlerCtx(t, s, req)
	if err := deferRow(hctx2, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx2, f2, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete (retry): %v", err)
	}
	if got := ledgerOwners(t, db, "a"); !slices.Equal(got, []int64{f2.Token}) {
		t.Fatalf("ledger after retry = %v, want [%d]", got, f2.Token)
	}
}

// TestDeferFailureRollsBackEverything: a deferred statement SQLite refuses
// rolls back the other deferred statements, the Tx writes and the
// response; Complete says so with storekit.ErrNotCommitted and releases the
// key, so a retry runs again at once (the lease is an hour long).
func TestDeferFailureRollsBackEverything(t *testing.T) {
	for _, withTx := range []bool{false, true} {
		name := map[bool]string{false: "deferred only", true: "after Tx"}[withTx]
		t.Run(name, func(t *testing.T) {
			db, _ := newDB(t)
			s := openStore(t, db)
			ledgerTable(t, db)
			req := claimReq("a", time.Hour)
			hctx, f := handlerCtx(t, s, req)
			if withTx {
				if err := book(hctx, "tx-row", f.Token); err != nil {
					t.Fatal(err)
				}
			}
			if err := deferRow(hctx, "a"); err != nil {
				t.Fatal(err)
			}
			if err := Defer(hctx, refusedStmt); err != nil {
				t.Fatal(err)
			}
			err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte("never")})
			if !errors.Is(err, storekit.ErrNotCommitted) {
				t.Fatalf("Complete = %v, want ErrNotCommitted", err)
			}
			for _, k := range []string{"a", "tx-row", "refused"} {
				if got := ledgerOwners(t, db, k); len(got) != 0 {
					t.Fatalf("ledger %s = %v, want nothing committed", k, got)
				}
			}
			requireStatus(t, s, "a", storekit.StatusFailed)
			if n := db.Stats().InUse; n != 0 {
				t.Fatalf("%d connections still in use", n)
			}
			// Released, not held for the hour's lease: the retry claims.
			hctx2, f2 := handlerCtx(t, s, req)
			if err := deferRow(hctx2, "a"); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(hctx2, f2, storekit.StoredResponse{Status: 201}); err != nil {
				t.Fatalf("complete (retry): %v", err)
			}
			if got := ledgerOwners(t, db, "a"); !slices.Equal(got, []int64{f2.Token}) {
				t.Fatalf("ledger after retry = %v, want [%d]", got, f2.Token)
			}
		})
	}
}

// TestDeferStaleOwnerWritesVanish: an owner whose lease lapsed and was
// taken over completes with ErrLeaseLost and its deferred statements (and
// Tx writes) never commit; the new owner's do.
func TestDeferStaleOwnerWritesVanish(t *testing.T) {
	for _, withTx := range []bool{false, true} {
		name := map[bool]string{false: "deferred only", true: "after Tx"}[withTx]
		t.Run(name, func(t *testing.T) {
			db, _ := newDB(t)
			s := openStore(t, db)
			ledgerTable(t, db)
			req := claimReq("a", 20*time.Millisecond)
			staleCtx, staleFence := handlerCtx(t, s, req)
			if err := deferRow(staleCtx, "a"); err != nil {
				t.Fatal(err)
			}
			var second storekit.ClaimResult
			for !second.Claimed {
				var err error
				if second, err = s.Claim(t.Context(), req); err != nil {
					t.Fatal(err)
				}
				time.Sleep(5 * time.Millisecond) // poll until the 20ms lease lapses
			}
			newFence := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: second.Record.Token}
			newCtx := storetest.ContextWithLease(t.Context(), storetest.NewLease(s, newFence))
			if err := deferRow(newCtx, "a"); err != nil {
				t.Fatal(err)
			}
			if withTx {
				// After the takeover: the stale owner's Tx begins, and
				// holds the write lock until its Complete.
				if err := book(staleCtx, "tx-row", staleFence.Token); err != nil {
					t.Fatal(err)
				}
			}
			err := s.Complete(staleCtx, staleFence, storekit.StoredResponse{Status: 201, Body: []byte("stale")})
			if !errors.Is(err, core.ErrLeaseLost) {
				t.Fatalf("stale Complete = %v, want ErrLeaseLost", err)
			}
			if err := s.Complete(newCtx, newFence, storekit.StoredResponse{Status: 201, Body: []byte("new")}); err != nil {
				t.Fatalf("new Complete: %v", err)
			}
			if got := ledgerOwners(t, db, "a"); !slices.Equal(got, []int64{newFence.Token}) {
				t.Fatalf("ledger = %v, want exactly the new owner's row [%d]", got, newFence.Token)
			}
			if got := ledgerOwners(t, db, "tx-row"); len(got) != 0 {
				t.Fatalf("the stale owner's Tx row landed: %v", got)
			}
			if r := requireStatus(t, s, "a", storekit.StatusCompleted); string(r.Response.Body) != "new" {
				t.Fatalf("stored body %q, want the new owner's", r.Response.Body)
			}
		})
	}
}

// TestDeferRefusals: no lease, a foreign store's lease, a finished lease.
func TestDeferRefusals(t *testing.T) {
	if err := Defer(context.Background(), "SELECT 1"); !errors.Is(err, ErrNoLease) {
		t.Fatalf("Defer without lease = %v, want ErrNoLease", err)
	}
	foreign := storetest.ContextWithLease(context.Background(), storetest.NewLease(otherStore{}, storekit.Fence{Key: "k"}))
	if err := Defer(foreign, "SELECT 1"); err == nil {
		t.Fatal("Defer with a foreign store's lease succeeded")
	}
	s := newStore(t)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if err := Defer(hctx, "SELECT 1"); !errors.Is(err, ErrLeaseFinished) {
		t.Fatalf("Defer after Complete = %v, want ErrLeaseFinished", err)
	}
}

// otherStore is a core.Store that is not a *Store.
type otherStore struct{ core.Store }

// TestDeferThroughEngine: through Engine.Call, a failing deferred statement
// fails the call with ErrNotCommitted and the next call runs fn again; a
// succeeding one commits exactly once however many callers race.
func TestDeferThroughEngine(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db) // for refusedStmt
	// No unique key: exactly one row is idem's doing, not the schema's.
	if _, err := db.Exec("CREATE TABLE calls (k TEXT NOT NULL, owner INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	book := func(ctx context.Context) error {
		l, _ := storekit.LeaseFromContext(ctx)
		return Defer(ctx, "INSERT INTO calls (k, owner) VALUES (?, ?)", "pay-1", l.Fence().Token)
	}
	calls := func() int {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM calls").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	e, err := core.New(s)
	if err != nil {
		t.Fatal(err)
	}
	req := core.CallRequest{Scope: "tenant", Key: "pay-1", Name: "charge", Input: []byte("42")}
	_, err = e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
		if err := book(ctx); err != nil {
			return nil, err
		}
		return []byte("booked"), Defer(ctx, refusedStmt)
	})
	if !errors.Is(err, storekit.ErrNotCommitted) {
		t.Fatalf("call with a failing deferred statement = %v, want ErrNotCommitted", err)
	}
	if n := calls(); n != 0 {
		t.Fatalf("%d rows after a failed commit", n)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		runs int
	)
	for range 8 {
		wg.Go(func() {
			out, err := e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
				mu.Lock()
				runs++
				mu.Unlock()
				return []byte("booked"), book(ctx)
			})
			if err != nil && !errors.Is(err, core.ErrInFlight) {
				t.Errorf("call: %v", err)
			}
			if err == nil && string(out.Value) != "booked" {
				t.Errorf("call result %q", out.Value)
			}
		})
	}
	wg.Wait()
	if n := calls(); n != 1 {
		t.Fatalf("%d rows after %d runs, want exactly 1", n, runs)
	}
}
