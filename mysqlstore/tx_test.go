package mysqlstore

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

// TestTxMarksSwept: a commit mark left behind by a process that died after
// the handler's own commit is deleted by Sweep after markTTL, not before
// (that the usual paths leave none, txtest checks after every case).
func TestTxMarksSwept(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("crashed", time.Minute)) // an hour's retention
	require.NoError(t, book(hctx, "crashed", f.Token))
	tx, err := Tx(hctx)
	require.NoError(t, err)
	require.NoError(t, tx.Commit()) // and no Complete: the process died
	_, err = s.Sweep(t.Context(), 100)
	require.NoError(t, err)
	require.Equal(t, 1, markRows(t, db), "marks after a sweep within markTTL")
	later := openStore(t, db, withClockOffset(markTTL+time.Minute))
	_, err = later.Sweep(t.Context(), 100)
	require.NoError(t, err)
	require.Equal(t, 0, markRows(t, db), "marks after a sweep past markTTL")
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
