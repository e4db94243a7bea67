package sqlitestore

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

// TestSaveStepRefusedInTx: while the lease transaction holds SQLite's
// write lock, SaveStep refuses at once instead of waiting busy_timeout for
// a lock its own execution holds (the heartbeat runs inside the
// transaction: txtest's Tx/HeartbeatWhileOpen).
func TestSaveStepRefusedInTx(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	hctx, f := handlerCtx(t, s, claimReq("a", time.Minute))
	require.NoError(t, book(hctx, "a", f.Token))
	// Well below busy_timeout (10s).
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	require.ErrorIs(t, s.SaveStep(ctx, f, "charge", []byte("x")), ErrStepInTx)
	require.NoError(t, s.Complete(hctx, f, storekit.StoredResponse{Status: 201}))
	require.Equal(t, 1, ledgerRows(t, db, "a"))
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
