package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

func ledgerTable(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE ledger (k TEXT PRIMARY KEY, owner INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
}

func ledgerRows(t *testing.T, db *sql.DB, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM ledger WHERE k = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func claimReq(key string, lease time.Duration) storekit.ClaimRequest {
	return storekit.ClaimRequest{Scope: "tenant", Key: key, Method: "POST", Route: "/v1/payments",
		Fingerprint: "f1", Lease: lease, Retention: time.Hour}
}

// handlerCtx claims req and returns the handler's context carrying the lease.
func handlerCtx(t *testing.T, s *Store, req storekit.ClaimRequest) (context.Context, storekit.Fence) {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %v (claimed %v)", err, res.Claimed)
	}
	f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	return storetest.ContextWithLease(t.Context(), storetest.NewLease(s, f)), f
}

func book(ctx context.Context, key string, owner int64) error {
	tx, err := Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO ledger (k, owner) VALUES (?, ?)", key, owner)
	return err
}

func requireStatus(t *testing.T, s *Store, key string, want storekit.Status) storekit.Record {
	t.Helper()
	r, err := s.Get(t.Context(), "tenant", key)
	if err != nil || r.Status != want {
		t.Fatalf("record %s: status %q, err %v; want %q", key, r.Status, err, want)
	}
	return r
}

func TestTxCommitsWithComplete(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	if n := ledgerRows(t, db, "a"); n != 0 {
		t.Fatalf("the handler's write is visible before Complete (%d rows)", n)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if n := ledgerRows(t, db, "a"); n != 1 {
		t.Fatalf("after Complete: %d ledger rows, want 1", n)
	}
	requireStatus(t, s, "a", storekit.StatusCompleted)
	if _, err := Tx(hctx); !errors.Is(err, ErrLeaseFinished) {
		t.Errorf("Tx after Complete: %v, want ErrLeaseFinished", err)
	}
}

func TestTxFailRollsBack(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(hctx, f); err != nil {
		t.Fatal(err)
	}
	if n := ledgerRows(t, db, "a"); n != 0 {
		t.Fatalf("after Fail: %d ledger rows, want 0", n)
	}
	requireStatus(t, s, "a", storekit.StatusFailed)
}

// TestTxOwnWritesDoNotDeadlock: while the lease transaction holds SQLite's
// write lock, the execution's own heartbeat runs inside it and SaveStep
// refuses at once; neither waits busy_timeout for a lock its own
// execution holds.
func TestTxOwnWritesDoNotDeadlock(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	// Well below busy_timeout (10s): a heartbeat waiting for the lock
	// would run past it.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if err := s.Heartbeat(ctx, f, time.Minute); err != nil {
		t.Fatalf("heartbeat with the lease transaction open: %v", err)
	}
	if err := s.SaveStep(ctx, f, "charge", []byte("x")); !errors.Is(err, ErrStepInTx) {
		t.Fatalf("SaveStep with the lease transaction open: %v, want ErrStepInTx", err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	requireStatus(t, s, "a", storekit.StatusCompleted)
	if n := ledgerRows(t, db, "a"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

// TestTxHandlerRollsBack: a handler that rolls back the transaction itself
// gets no recorded response; the key is released for a retry.
func TestTxHandlerRollsBack(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	tx, _ := Tx(hctx)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	if !errors.Is(err, storekit.ErrNotCommitted) {
		t.Fatalf("Complete after the handler's rollback: %v, want ErrNotCommitted", err)
	}
	requireStatus(t, s, "a", storekit.StatusFailed)
}

// TestTxHandlerCommits: a handler that commits itself has its response
// recorded by the plain fenced update.
func TestTxHandlerCommits(t *testing.T) {
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
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	requireStatus(t, s, "a", storekit.StatusCompleted)
	if n := ledgerRows(t, db, "a"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

// TestTxTakeoverFindsMark: a handler committed itself and its process died
// before Complete; the claim that would take the lapsed lease over finds
// the commit mark and completes the record as not retained instead of
// running the handler again.
func TestTxTakeoverFindsMark(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	// Long enough for book and Commit on a loaded machine, then polled out.
	req := claimReq("a", 500*time.Millisecond)
	hctx, f := handlerCtx(t, s, req)
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	tx, _ := Tx(hctx)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	s.takeTx(hctx, f) // the process "dies": nobody will Complete
	var res storekit.ClaimResult
	for {
		var err error
		if res, err = s.Claim(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		if res.Record.Status != storekit.StatusProcessing || res.Record.Token != f.Token {
			break
		}
		time.Sleep(10 * time.Millisecond) // poll until the lease lapses
	}
	if res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil || !res.Record.Response.NotRetained {
		t.Fatalf("takeover over a committed handler: claimed %v, %+v", res.Claimed, res.Record)
	}
	if n := ledgerRows(t, db, "a"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

// TestSweepKeepsMarkOfProcessingRecord: with a retention longer than a day,
// a handler commits its Tx transaction itself and its process dies before
// Complete. Its commit mark is all that keeps a retry from running the
// committed writes again, for as long as the record is retained: Sweep
// must not delete it after a day while the record is still processing
// under its token. Once the record no longer needs it (completed), Sweep
// deletes it.
func TestSweepKeepsMarkOfProcessingRecord(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	req := claimReq("week", time.Minute)
	req.Retention = 7 * 24 * time.Hour
	hctx, f := handlerCtx(t, s, req)
	if err := book(hctx, req.Key, f.Token); err != nil {
		t.Fatal(err)
	}
	tx, err := Tx(hctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	s.takeTx(hctx, f) // the process "dies": nobody will Complete
	// Two days later, Sweep runs, then a retry.
	later := openStore(t, db, withClockOffset(2*24*time.Hour))
	if _, err := later.Sweep(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	res, err := later.Claim(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Claimed {
		t.Fatalf("a retry two days later took the key over (token %d) although the handler's writes committed (%d ledger rows): the payment runs again",
			res.Record.Token, ledgerRows(t, db, req.Key))
	}
	if res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil || !res.Record.Response.NotRetained {
		t.Fatalf("retry answered %s %+v, want completed as not retained", res.Record.Status, res.Record.Response)
	}
	if n := ledgerRows(t, db, req.Key); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	// The record is completed: its mark is no longer needed.
	if _, err := later.Sweep(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	var marks int
	if err := db.QueryRow("SELECT COUNT(*) FROM idem_records_txmarks").Scan(&marks); err != nil {
		t.Fatal(err)
	}
	if marks != 0 {
		t.Errorf("%d commit marks after the record completed and a sweep, want 0", marks)
	}
}

// TestTxStaleOwnerRollsBack: an owner whose lease was taken over before it
// began its transaction loses its writes with its Complete.
func TestTxStaleOwnerRollsBack(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db, withClockOffset(0))
	ledgerTable(t, db)
	req := claimReq("a", 20*time.Millisecond)
	hctx, f := handlerCtx(t, s, req)
	var second storekit.ClaimResult
	for !second.Claimed {
		var err error
		if second, err = s.Claim(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // poll until the 20ms lease lapses
	}
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("stale owner's Complete: %v, want ErrLeaseLost", err)
	}
	if n := ledgerRows(t, db, "a"); n != 0 {
		t.Fatalf("the stale owner's row landed (%d rows)", n)
	}
	r := requireStatus(t, s, "a", storekit.StatusProcessing)
	if r.Token != second.Record.Token {
		t.Fatalf("token %d, want the new owner's %d", r.Token, second.Record.Token)
	}
}

// TestTxEndedBySQLite: SQLite rolled the lease transaction back behind
// database/sql's back (here the handler sends ROLLBACK as SQL; a statement
// interrupted by its cancelled context does the same). Complete must
// refuse the response and release the key: the old code ran the complete
// UPDATE in autocommit and stored a 201 for writes that never landed.
func TestTxEndedBySQLite(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	tx, _ := Tx(hctx)
	if _, err := tx.ExecContext(hctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	if !errors.Is(err, storekit.ErrNotCommitted) {
		t.Fatalf("Complete after SQLite ended the transaction: %v, want ErrNotCommitted", err)
	}
	if n := ledgerRows(t, db, "a"); n != 0 {
		t.Fatalf("%d ledger rows, want 0", n)
	}
	requireStatus(t, s, "a", storekit.StatusFailed)
}

// TestTxMarkKeptWhenEndFails: a handler committed its transaction itself,
// then the Complete or Fail that would end its record fails with an error
// that is not a lost lease. The commit mark must stay: the claim that takes
// the lapsed lease over finds it and completes the record as not retained
// instead of running the handler (and its committed writes) again.
//
// The failure is a trigger refusing the record's completion, not SQLite's
// write lock held from another connection: that lock would also refuse the
// mark's DELETE, so the mark stayed even before the fix; a failure that
// leaves the rest of the file writable is the one that shows the bug.
func TestTxMarkKeptWhenEndFails(t *testing.T) {
	for _, end := range []string{"complete", "fail", "complete with deferred"} {
		t.Run(end, func(t *testing.T) {
			db, _ := newDB(t)
			s := openStore(t, db)
			ledgerTable(t, db)
			req := claimReq("a", time.Minute)
			hctx, f := handlerCtx(t, s, req)
			if err := book(hctx, "a", f.Token); err != nil {
				t.Fatal(err)
			}
			tx, err := Tx(hctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if end == "complete with deferred" {
				if err := Defer(hctx, "UPDATE ledger SET owner = -owner WHERE k = ?", "a"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.Exec(`CREATE TRIGGER refuse_complete BEFORE UPDATE OF status ON idem_records
				WHEN NEW.status = 'completed' BEGIN SELECT RAISE(ABORT, 'completion refused'); END`); err != nil {
				t.Fatal(err)
			}
			if end == "fail" {
				err = s.Fail(hctx, f)
			} else {
				err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
			}
			if err == nil || errors.Is(err, core.ErrLeaseLost) {
				t.Fatalf("%s = %v, want the refused completion", end, err)
			}
			if _, err := db.Exec("DROP TRIGGER refuse_complete"); err != nil {
				t.Fatal(err)
			}
			var marks int
			if err := db.QueryRow("SELECT COUNT(*) FROM idem_records_txmarks").Scan(&marks); err != nil {
				t.Fatal(err)
			}
			if marks != 1 {
				t.Errorf("%d commit marks after the failed %s, want 1", marks, end)
			}
			requireStatus(t, s, "a", storekit.StatusProcessing)
			later := openStore(t, db, withClockOffset(10*time.Minute))
			res, err := later.Claim(t.Context(), req)
			if err != nil || res.Claimed || res.Record.Status != storekit.StatusCompleted ||
				res.Record.Response == nil || !res.Record.Response.NotRetained {
				t.Fatalf("takeover = %+v, %v; want no claim, completed as not retained", res, err)
			}
			// The handler's committed row, once; the deferred update never ran.
			if got := ledgerOwners(t, db, "a"); !slices.Equal(got, []int64{f.Token}) {
				t.Fatalf("ledger = %v, want [%d]", got, f.Token)
			}
		})
	}
}
