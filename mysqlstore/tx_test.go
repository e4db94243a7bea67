package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

func ledgerTable(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE ledger (k VARBINARY(255) PRIMARY KEY, owner BIGINT NOT NULL)"); err != nil {
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

func TestTxCommitsWithComplete(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
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
	if r, err := s.Get(t.Context(), f.Scope, f.Key); err != nil || r.Status != storekit.StatusCompleted {
		t.Fatalf("record: %v %v", r.Status, err)
	}
	if _, err := Tx(hctx); !errors.Is(err, ErrLeaseFinished) {
		t.Errorf("Tx after Complete: %v, want ErrLeaseFinished", err)
	}
}

// TestTxStaleOwnerRollsBack: an owner whose lease lapsed and was taken over
// loses its writes with its Complete; the new owner's commit.
func TestTxStaleOwnerRollsBack(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	req := claimReq("stale", 50*time.Millisecond)
	staleCtx, stale := handlerCtx(t, s, req)
	if err := book(staleCtx, "stale-"+"1", stale.Token); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	req.Lease = time.Minute
	newCtx, fresh := handlerCtx(t, s, req)
	if fresh.Token <= stale.Token {
		t.Fatalf("takeover token %d not above %d", fresh.Token, stale.Token)
	}
	if err := book(newCtx, "stale-2", fresh.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(staleCtx, stale, storekit.StoredResponse{Status: 201}); !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("stale Complete: %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(newCtx, fresh, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if n := ledgerRows(t, db, "stale-1"); n != 0 {
		t.Errorf("stale owner's write survived (%d rows)", n)
	}
	if n := ledgerRows(t, db, "stale-2"); n != 1 {
		t.Errorf("new owner's write: %d rows, want 1", n)
	}
}

func TestTxFailRollsBack(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("f", time.Minute))
	if err := book(hctx, "f", f.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(hctx, f); err != nil {
		t.Fatal(err)
	}
	if n := ledgerRows(t, db, "f"); n != 0 {
		t.Errorf("write survived Fail (%d rows)", n)
	}
	if r, _ := s.Get(t.Context(), f.Scope, f.Key); r.Status != storekit.StatusFailed {
		t.Errorf("status %s, want failed", r.Status)
	}
}

// TestTxOutlivesRequestContext: the request's context ends (client gone)
// before the engine commits; the transaction must still be there.
func TestTxOutlivesRequestContext(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	res, err := s.Claim(t.Context(), claimReq("c", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	f := storekit.Fence{Scope: "tenant", Key: "c", Token: res.Record.Token}
	lease := storetest.NewLease(s, f)
	rctx, cancel := context.WithCancel(t.Context())
	hctx := storetest.ContextWithLease(rctx, lease)
	if err := book(hctx, "c", f.Token); err != nil {
		t.Fatal(err)
	}
	cancel()
	time.Sleep(50 * time.Millisecond) // database/sql would roll back here if the tx were bound to rctx
	cctx := storetest.ContextWithLease(context.WithoutCancel(rctx), lease)
	if err := s.Complete(cctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if n := ledgerRows(t, db, "c"); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

func TestTxNoLease(t *testing.T) {
	if _, err := Tx(t.Context()); !errors.Is(err, ErrNoLease) {
		t.Errorf("Tx without lease: %v", err)
	}
}

// TestTwoPoolsOneClaim: two pools (as two processes would have) race 32
// goroutines each for one key: exactly one claim, everyone else sees it.
func TestTwoPoolsOneClaim(t *testing.T) {
	cfg := mysqlstoretest.Database(t, "")
	a := openStore(t, mysqlstoretest.Open(t, cfg))
	b := openStore(t, mysqlstoretest.Open(t, cfg), WithReadFirst()) // a rollout of the option: both paths race
	for round := range 20 {
		req := claimReq("race-"+string(rune('a'+round)), time.Minute)
		var (
			mu     sync.Mutex
			wins   int
			tokens = map[int64]bool{}
			wg     sync.WaitGroup
		)
		for i := range 64 {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := s.Claim(context.Background(), req)
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if res.Claimed {
					wins++
				}
				tokens[res.Record.Token] = true
			}()
		}
		wg.Wait()
		if wins != 1 || len(tokens) != 1 {
			t.Errorf("round %d: %d winners, %d distinct tokens seen; want 1 and 1", round, wins, len(tokens))
		}
	}
}

func markRows(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM idem_records_txmarks").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTxMarks: the commit mark Tx writes never lands on the usual paths
// (Complete in the transaction, Fail); the one a self-committing handler
// landed is deleted by its Complete; one left behind by a process that died
// after the handler's own commit is deleted by Sweep after markTTL, not
// before.
func TestTxMarks(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)

	hctx, f := handlerCtx(t, s, claimReq("complete", time.Minute))
	if err := book(hctx, "complete", f.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	hctx, f = handlerCtx(t, s, claimReq("fail", time.Minute))
	if err := book(hctx, "fail", f.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(hctx, f); err != nil {
		t.Fatal(err)
	}
	if n := markRows(t, db); n != 0 {
		t.Errorf("%d marks after Complete and Fail in the transaction, want 0", n)
	}

	selfCommit := func(key string) (context.Context, storekit.Fence) {
		hctx, f := handlerCtx(t, s, claimReq(key, time.Minute))
		if err := book(hctx, key, f.Token); err != nil {
			t.Fatal(err)
		}
		tx, err := Tx(hctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return hctx, f
	}
	hctx, f = selfCommit("self")
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if n := markRows(t, db); n != 0 {
		t.Errorf("%d marks after a self-committed Complete, want 0", n)
	}

	selfCommit("crashed") // no Complete: the process died
	if _, err := s.Sweep(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	if n := markRows(t, db); n != 1 {
		t.Errorf("%d marks after a sweep within markTTL, want 1", n)
	}
	later := openStore(t, db, withClockOffset(markTTL+time.Minute))
	if _, err := later.Sweep(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	if n := markRows(t, db); n != 0 {
		t.Errorf("%d marks after a sweep past markTTL, want 0", n)
	}
}

// TestTxReadOnlyUnmarked: a read-only transaction (WithTxOptions) writes no
// mark (it could not), and a handler ending it still gets its response
// recorded: it wrote nothing to lose.
func TestTxReadOnlyUnmarked(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db, WithTxOptions(&sql.TxOptions{ReadOnly: true}))
	hctx, f := handlerCtx(t, s, claimReq("ro", time.Minute))
	tx, err := Tx(hctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 200}); err != nil {
		t.Fatalf("complete after a read-only transaction ended: %v", err)
	}
	if n := markRows(t, db); n != 0 {
		t.Errorf("%d marks, want 0", n)
	}
}

// TestTxReadOnlyCompletes: with read-only transactions (WithTxOptions), a
// handler that reads in its Tx and leaves it to idem gets its response
// recorded, and its deferred writes commit with it: the fenced update
// cannot run inside a read-only transaction (the server refuses writes
// there), and need not, since the transaction has no writes to commit with
// it.
func TestTxReadOnlyCompletes(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db, WithTxOptions(&sql.TxOptions{ReadOnly: true}))
	ledgerTable(t, db)
	req := claimReq("ro", time.Minute)
	hctx, f := handlerCtx(t, s, req)
	tx, err := Tx(hctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(hctx, "SELECT COUNT(*) FROM ledger").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := Defer(hctx, "INSERT INTO ledger (k, owner) VALUES (?, ?)", req.Key, f.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 200, Body: []byte("read")}); err != nil {
		t.Fatalf("complete in a read-only transaction: %v", err)
	}
	rec, err := s.Get(t.Context(), req.Scope, req.Key)
	if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || string(rec.Response.Body) != "read" {
		t.Fatalf("record = %+v, %v; want completed with the response", rec, err)
	}
	var owner int64
	if err := db.QueryRow("SELECT owner FROM ledger WHERE k = ?", req.Key).Scan(&owner); err != nil || owner != f.Token {
		t.Fatalf("ledger row: owner %d, %v; want the deferred row of token %d", owner, err, f.Token)
	}
}

// TestTxMarkKeptWhenEndFails: a handler committed its transaction itself,
// then the Complete or Fail that would end its record fails (here a lock
// wait timeout on the record's row). The commit mark must stay: the claim
// that takes the lapsed lease over finds it and completes the record as not
// retained instead of running the handler (and its committed writes) again.
func TestTxMarkKeptWhenEndFails(t *testing.T) {
	for _, end := range []string{"complete", "fail"} {
		t.Run(end, func(t *testing.T) {
			cfg := mysqlstoretest.Database(t, "")
			cfg.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
			db := mysqlstoretest.Open(t, cfg)
			s := openStore(t, db, WithDeadlockRetries(0))
			ledgerTable(t, db)
			req := claimReq("k", time.Minute)
			hctx, f := handlerCtx(t, s, req)
			if err := book(hctx, "k", f.Token); err != nil {
				t.Fatal(err)
			}
			tx, err := Tx(hctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			// Another session holds the record's row: the fenced update
			// times out.
			lock, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lock.Exec("SELECT token FROM idem_records WHERE scope = ? AND `key` = ? FOR UPDATE", req.Scope, req.Key); err != nil {
				t.Fatal(err)
			}
			if end == "complete" {
				err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
			} else {
				err = s.Fail(hctx, f)
			}
			if rerr := lock.Rollback(); rerr != nil {
				t.Fatal(rerr)
			}
			if err == nil || errors.Is(err, core.ErrLeaseLost) {
				t.Fatalf("%s = %v, want the lock wait timeout", end, err)
			}
			if n := markRows(t, db); n != 1 {
				t.Fatalf("%d commit marks after the failed %s, want 1", n, end)
			}
			later := openStore(t, db, withClockOffset(10*time.Minute))
			res, err := later.Claim(t.Context(), req)
			if err != nil || res.Claimed || res.Record.Status != storekit.StatusCompleted ||
				res.Record.Response == nil || !res.Record.Response.NotRetained {
				t.Fatalf("takeover = %+v, %v; want no claim, completed as not retained", res, err)
			}
		})
	}
}

// TestTxEndedByServer: the server ended the lease transaction behind
// database/sql's back (here the handler sends ROLLBACK as SQL; a deadlock
// (1213) or a Galera brute-force abort inside the handler's transaction
// rolls it back the same way, and the connection goes on in autocommit).
// Complete must refuse the response: running the fenced complete in
// autocommit stores a 201 for writes that never landed. It must not
// release the key either: what the handler ran after the rollback
// autocommitted (TestTxWritesAfterServerRollback). The record is completed
// as not retained.
func TestTxEndedByServer(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	if err := book(hctx, "a", f.Token); err != nil {
		t.Fatal(err)
	}
	tx, err := Tx(hctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(hctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	if !errors.Is(err, ErrTxRolledByServer) || errors.Is(err, storekit.ErrNotCommitted) {
		t.Errorf("Complete after the server ended the transaction: %v, want ErrTxRolledByServer", err)
	}
	if n := ledgerRows(t, db, "a"); n != 0 {
		t.Errorf("%d ledger rows, want 0", n)
	}
	if r, err := s.Get(t.Context(), f.Scope, f.Key); err != nil || r.Status != storekit.StatusCompleted || r.Response == nil || !r.Response.NotRetained {
		t.Errorf("record: %v %+v %v, want completed as not retained", r.Status, r.Response, err)
	}
	if n := markRows(t, db); n != 0 {
		t.Errorf("%d marks, want 0", n)
	}
}
