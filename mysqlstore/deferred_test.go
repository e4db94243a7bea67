package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// deferRow queues the ledger row (k, the lease's token) with Defer.
func deferRow(ctx context.Context, k string) error {
	l, _ := storekit.LeaseFromContext(ctx)
	return Defer(ctx, "INSERT INTO ledger (k, owner) VALUES (?, ?)", k, l.Fence().Token)
}

// ledgerOwners returns the owner column of every ledger row, by key.
func ledgerOwners(t *testing.T, db *sql.DB) map[string]int64 {
	t.Helper()
	rows, err := db.Query("SELECT k, owner FROM ledger")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]int64{}
	for rows.Next() {
		var (
			k     string
			owner int64
		)
		if err := rows.Scan(&k, &owner); err != nil {
			t.Fatal(err)
		}
		got[k] = owner
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func inUse(db *sql.DB) int { return db.Stats().InUse }

// TestDeferCommitsWithRecord: deferred statements run at Complete, in the
// order queued, in one transaction with the stored response; nothing runs
// before, and no connection stays in use.
func TestDeferCommitsWithRecord(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("k1", time.Minute))
	if err := deferRow(hctx, "k1"); err != nil {
		t.Fatalf("Defer: %v", err)
	}
	// The second statement sees the first: order is kept, in one
	// transaction.
	if err := Defer(hctx, "UPDATE ledger SET owner = owner * 10 WHERE k = ?", "k1"); err != nil {
		t.Fatalf("Defer (second): %v", err)
	}
	if got := ledgerOwners(t, db); len(got) != 0 {
		t.Fatalf("deferred row visible before Complete: %v", got)
	}
	if n := inUse(db); n != 0 {
		t.Fatalf("Defer holds %d connections", n)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if got := ledgerOwners(t, db); len(got) != 1 || got["k1"] != f.Token*10 {
		t.Fatalf("ledger after Complete = %v, want k1: %d", got, f.Token*10)
	}
	rec, err := s.Get(t.Context(), f.Scope, f.Key)
	if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || string(rec.Response.Body) != "ok" {
		t.Fatalf("record = %+v, %v", rec, err)
	}
	if n := inUse(db); n != 0 {
		t.Fatalf("%d connections still in use after Complete", n)
	}
	if err := Defer(hctx, "SELECT 1"); !errors.Is(err, ErrLeaseFinished) {
		t.Fatalf("Defer after Complete = %v, want ErrLeaseFinished", err)
	}
}

// TestDeferAfterTx: with a transaction begun through Tx, the deferred
// statements run in it, after the handler's statements, and commit with
// them and the record; the commit mark does not land.
func TestDeferAfterTx(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("k1", time.Minute))
	// Queued before the Tx statement, run after it: it updates that row.
	if err := Defer(hctx, "UPDATE ledger SET owner = -owner WHERE k = ?", "k1"); err != nil {
		t.Fatal(err)
	}
	if err := book(hctx, "k1", f.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if got := ledgerOwners(t, db); len(got) != 1 || got["k1"] != -f.Token {
		t.Fatalf("ledger = %v, want k1: %d (the Tx row, updated by the deferred statement)", got, -f.Token)
	}
	if n := markRows(t, db); n != 0 {
		t.Errorf("%d commit marks landed, want 0", n)
	}
	if n := inUse(db); n != 0 {
		t.Fatalf("%d connections still in use", n)
	}
}

// TestDeferNotRunOnFail: a released key runs none of its deferred
// statements, and its retry's own land.
func TestDeferNotRunOnFail(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	req := claimReq("k1", time.Minute)
	hctx, f := handlerCtx(t, s, req)
	if err := Defer(hctx, "INSERT INTO ledger (k, owner) VALUES ('failed', 1)"); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(hctx, f); err != nil {
		t.Fatalf("fail: %v", err)
	}
	if got := ledgerOwners(t, db); len(got) != 0 {
		t.Fatalf("ledger after Fail = %v, want nothing", got)
	}
	if err := Defer(hctx, "SELECT 1"); !errors.Is(err, ErrLeaseFinished) {
		t.Fatalf("Defer after Fail = %v, want ErrLeaseFinished", err)
	}
	hctx2, f2 := handlerCtx(t, s, req)
	if err := deferRow(hctx2, "k1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx2, f2, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete (retry): %v", err)
	}
	if got := ledgerOwners(t, db); len(got) != 1 || got["k1"] != f2.Token {
		t.Fatalf("ledger after the retry = %v, want k1: %d", got, f2.Token)
	}
}

// TestDeferFailureRollsBackEverything: a deferred statement the server
// refuses rolls back the other deferred statements, the Tx writes and the
// response; Complete says so with storekit.ErrNotCommitted and releases the
// key, so a retry runs again at once (not after the hour's lease).
func TestDeferFailureRollsBackEverything(t *testing.T) {
	for _, withTx := range []bool{false, true} {
		t.Run(map[bool]string{false: "deferred only", true: "after Tx"}[withTx], func(t *testing.T) {
			db := mysqlstoretest.NewDB(t, "")
			s := openStore(t, db)
			ledgerTable(t, db)
			req := claimReq("k1", time.Hour)
			hctx, f := handlerCtx(t, s, req)
			if withTx {
				if err := book(hctx, "tx", f.Token); err != nil {
					t.Fatal(err)
				}
			}
			if err := deferRow(hctx, "k1"); err != nil {
				t.Fatal(err)
			}
			// A duplicate primary key: refused (1062).
			if err := deferRow(hctx, "k1"); err != nil {
				t.Fatal(err)
			}
			err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte("never")})
			if !errors.Is(err, storekit.ErrNotCommitted) {
				t.Fatalf("Complete = %v, want ErrNotCommitted", err)
			}
			if got := ledgerOwners(t, db); len(got) != 0 {
				t.Fatalf("ledger = %v, want nothing committed", got)
			}
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			if err != nil || rec.Status != storekit.StatusFailed {
				t.Fatalf("record = %+v, %v; want failed (released)", rec, err)
			}
			if n := markRows(t, db); n != 0 {
				t.Errorf("%d commit marks landed, want 0", n)
			}
			if n := inUse(db); n != 0 {
				t.Fatalf("%d connections still in use", n)
			}
			hctx2, f2 := handlerCtx(t, s, req)
			if err := deferRow(hctx2, "k1"); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(hctx2, f2, storekit.StoredResponse{Status: 201}); err != nil {
				t.Fatalf("complete (retry): %v", err)
			}
			if got := ledgerOwners(t, db); len(got) != 1 || got["k1"] != f2.Token {
				t.Fatalf("ledger after the retry = %v, want k1: %d", got, f2.Token)
			}
		})
	}
}

// TestDeferStaleOwnerWritesVanish: an owner whose lease was taken over
// completes with ErrLeaseLost, its deferred statements never commit (and
// are not even sent: one that the server would refuse does not turn the
// answer into ErrNotCommitted), and the new owner's do.
func TestDeferStaleOwnerWritesVanish(t *testing.T) {
	for _, withTx := range []bool{false, true} {
		t.Run(map[bool]string{false: "deferred only", true: "after Tx"}[withTx], func(t *testing.T) {
			db := mysqlstoretest.NewDB(t, "")
			s := openStore(t, db)
			// A store whose clock runs 10 minutes ahead finds the lease lapsed
			// and takes the key over.
			later := openStore(t, db, withClockOffset(10*time.Minute))
			ledgerTable(t, db)
			req := claimReq("k1", time.Minute)
			staleCtx, stale := handlerCtx(t, s, req)
			if withTx {
				if err := book(staleCtx, "stale-tx", stale.Token); err != nil {
					t.Fatal(err)
				}
			}
			if err := deferRow(staleCtx, "stale"); err != nil {
				t.Fatal(err)
			}
			if err := deferRow(staleCtx, "stale"); err != nil { // would be refused
				t.Fatal(err)
			}
			newCtx, fresh := handlerCtx(t, later, req)
			if fresh.Token <= stale.Token {
				t.Fatalf("takeover token %d not above %d", fresh.Token, stale.Token)
			}
			if err := deferRow(newCtx, "new"); err != nil {
				t.Fatal(err)
			}
			err := s.Complete(staleCtx, stale, storekit.StoredResponse{Status: 201, Body: []byte("stale")})
			if !errors.Is(err, core.ErrLeaseLost) || errors.Is(err, storekit.ErrNotCommitted) {
				t.Fatalf("stale Complete = %v, want ErrLeaseLost", err)
			}
			if err := later.Complete(newCtx, fresh, storekit.StoredResponse{Status: 201, Body: []byte("new")}); err != nil {
				t.Fatalf("new Complete: %v", err)
			}
			if got := ledgerOwners(t, db); len(got) != 1 || got["new"] != fresh.Token {
				t.Fatalf("ledger = %v, want exactly the new owner's row (new: %d)", got, fresh.Token)
			}
		})
	}
}

// foreignStore is a core.Store that is not a *Store and unwraps to none.
type foreignStore struct{ core.Store }

// TestDeferRefusals: no lease, a foreign store's lease, a finished lease.
// (After Fail: TestDeferNotRunOnFail.)
func TestDeferRefusals(t *testing.T) {
	if err := Defer(t.Context(), "SELECT 1"); !errors.Is(err, ErrNoLease) {
		t.Fatalf("Defer without lease = %v, want ErrNoLease", err)
	}
	ctx := storetest.ContextWithLease(t.Context(), storetest.NewLease(foreignStore{}, storekit.Fence{Key: "k"}))
	if err := Defer(ctx, "SELECT 1"); err == nil {
		t.Fatal("Defer with a foreign store's lease succeeded")
	}
	s := newStore(t)
	hctx, f := handlerCtx(t, s, claimReq("k1", time.Minute))
	if err := Defer(hctx, "SELECT 1"); err != nil {
		t.Fatalf("Defer: %v", err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := Defer(hctx, "SELECT 1"); !errors.Is(err, ErrLeaseFinished) {
		t.Fatalf("Defer after Complete = %v, want ErrLeaseFinished", err)
	}
}

// TestDeferRetriesDeadlock: without Tx, a deadlock or certification
// conflict (1213) in the deferred transaction runs it again: every
// statement in it is the store's to send. A trigger refuses the first
// attempt with 1213, counting attempts in a MEMORY table (not
// transactional: the count survives the rollback).
func TestDeferRetriesDeadlock(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	for _, q := range []string{
		"CREATE TABLE attempts (n INT) ENGINE=MEMORY",
		`CREATE TRIGGER ledger_once BEFORE INSERT ON ledger FOR EACH ROW BEGIN
			INSERT INTO attempts VALUES (1);
			IF (SELECT COUNT(*) FROM attempts) = 1 THEN
				SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'test: deadlock on the first attempt';
			END IF;
		END`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	hctx, f := handlerCtx(t, s, claimReq("k1", time.Minute))
	if err := deferRow(hctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	var attempts int
	if err := db.QueryRow("SELECT COUNT(*) FROM attempts").Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if got := ledgerOwners(t, db); len(got) != 1 || got["k1"] != f.Token || attempts != 2 {
		t.Fatalf("ledger = %v after %d attempts, want k1: %d after 2", got, attempts, f.Token)
	}
}

// TestDeferConnectionLost: a deferred statement whose connection dies is
// not reported as refused (storekit.ErrNotCommitted means the server said
// no; a lost connection, as at COMMIT, may leave the outcome unknown), and
// the key is released all the same.
func TestDeferConnectionLost(t *testing.T) {
	cfg := mysqlstoretest.Database(t, "")
	db := mysqlstoretest.Open(t, cfg)
	admin := mysqlstoretest.Open(t, mysqlstoretest.Config(t, ""))
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("k1", time.Hour))
	if err := deferRow(hctx, "k1"); err != nil {
		t.Fatal(err)
	}
	marker := fmt.Sprintf("deferred-%d", f.Token)
	if err := Defer(hctx, "SELECT SLEEP(30), '"+marker+"'"); err != nil {
		t.Fatal(err)
	}
	killed := make(chan error, 1)
	go func() {
		// Kill the connection once the deferred statement runs on it.
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			var id int64
			err := admin.QueryRow("SELECT id FROM information_schema.processlist WHERE db = ? AND info LIKE ? AND id <> CONNECTION_ID()",
				cfg.DBName, "%"+marker+"'%").Scan(&id)
			if errors.Is(err, sql.ErrNoRows) {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if err == nil {
				_, err = admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id))
			}
			killed <- err
			return
		}
		killed <- errors.New("the deferred statement never showed in the processlist")
	}()
	err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	if kerr := <-killed; kerr != nil {
		t.Fatalf("kill: %v", kerr)
	}
	if err == nil || errors.Is(err, storekit.ErrNotCommitted) || errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("Complete = %v, want a plain error (connection lost, not a refusal)", err)
	}
	if got := ledgerOwners(t, db); len(got) != 0 {
		t.Fatalf("ledger = %v, want nothing committed", got)
	}
	rec, err := s.Get(t.Context(), f.Scope, f.Key)
	if err != nil || rec.Status != storekit.StatusFailed {
		t.Fatalf("record = %+v, %v; want failed (released)", rec, err)
	}
}

// TestDeferThroughEngine: through Engine.Call, a refused deferred statement
// fails the call with ErrNotCommitted and the next call runs fn again; a
// succeeding one commits exactly once however many callers race.
func TestDeferThroughEngine(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	e, err := core.New(s)
	if err != nil {
		t.Fatal(err)
	}
	req := core.CallRequest{Scope: "tenant", Key: "pay-1", Name: "charge", Input: []byte("42")}
	_, err = e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
		if err := deferRow(ctx, "pay-1"); err != nil {
			return nil, err
		}
		return []byte("booked"), deferRow(ctx, "pay-1") // a duplicate: refused
	})
	if !errors.Is(err, storekit.ErrNotCommitted) {
		t.Fatalf("call with a refused deferred statement = %v, want ErrNotCommitted", err)
	}
	if got := ledgerOwners(t, db); len(got) != 0 {
		t.Fatalf("ledger = %v after a failed commit", got)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		tokens []int64
	)
	for range 8 {
		wg.Go(func() {
			out, err := e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
				l, _ := storekit.LeaseFromContext(ctx)
				mu.Lock()
				tokens = append(tokens, l.Fence().Token)
				mu.Unlock()
				return []byte("booked"), deferRow(ctx, "pay-1")
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
	got := ledgerOwners(t, db)
	if len(got) != 1 || !slices.Contains(tokens, got["pay-1"]) {
		t.Fatalf("ledger = %v after runs with tokens %v, want exactly one of theirs", got, tokens)
	}
}

// TestDeferHandlerEndedTx: a handler that ended its Tx transaction itself
// (see Tx) gets its deferred statements committed with the response only
// if its own writes committed (the commit mark says so); if it rolled back,
// neither lands. If it committed and a deferred statement is refused, the
// key is not released (a retry would run the committed writes again): the
// record is completed as not retained, as Fail does.
func TestDeferHandlerEndedTx(t *testing.T) {
	for _, tc := range []struct {
		name            string
		commit, refused bool
	}{{"committed", true, false}, {"rolled back", false, false}, {"committed, deferred refused", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			db := mysqlstoretest.NewDB(t, "")
			s := openStore(t, db)
			ledgerTable(t, db)
			hctx, f := handlerCtx(t, s, claimReq("k1", time.Hour))
			if err := book(hctx, "tx", f.Token); err != nil {
				t.Fatal(err)
			}
			if err := deferRow(hctx, "deferred"); err != nil {
				t.Fatal(err)
			}
			if tc.refused {
				if err := deferRow(hctx, "deferred"); err != nil {
					t.Fatal(err)
				}
			}
			tx, err := Tx(hctx)
			if err != nil {
				t.Fatal(err)
			}
			end := tx.Rollback
			if tc.commit {
				end = tx.Commit
			}
			if err := end(); err != nil {
				t.Fatal(err)
			}
			err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
			rec, gerr := s.Get(t.Context(), f.Scope, f.Key)
			if gerr != nil {
				t.Fatal(gerr)
			}
			got := ledgerOwners(t, db)
			switch {
			case tc.refused:
				if err == nil || errors.Is(err, storekit.ErrNotCommitted) || rec.Status != storekit.StatusCompleted ||
					rec.Response == nil || !rec.Response.NotRetained {
					t.Fatalf("Complete = %v, record %s %+v; want an error, completed as not retained", err, rec.Status, rec.Response)
				}
				if len(got) != 1 || got["tx"] != f.Token {
					t.Fatalf("ledger = %v, want the handler's row only", got)
				}
			case tc.commit:
				if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || rec.Response.Status != 201 {
					t.Fatalf("Complete = %v, record %s; want recorded", err, rec.Status)
				}
				if len(got) != 2 || got["tx"] != f.Token || got["deferred"] != f.Token {
					t.Fatalf("ledger = %v, want the handler's row and the deferred one", got)
				}
			default:
				if !errors.Is(err, ErrTxRolledBack) || rec.Status != storekit.StatusFailed {
					t.Fatalf("Complete = %v, record %s; want ErrTxRolledBack, released", err, rec.Status)
				}
				if len(got) != 0 {
					t.Fatalf("ledger = %v, want nothing", got)
				}
			}
			if n := markRows(t, db); n != 0 {
				t.Errorf("%d commit marks left, want 0", n)
			}
		})
	}
}
