package mysqlstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestSweepKeepsMarkOfProcessingRecord: with a retention longer than a day,
// a handler commits its Tx transaction itself and its process dies before
// Complete. Its commit mark is all that keeps a retry from running the
// committed writes again, for as long as the record is retained: Sweep
// must not delete it after a day while the record is still processing
// under its token. Once the record no longer needs it (completed, or gone),
// Sweep deletes it.
func TestSweepKeepsMarkOfProcessingRecord(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	req := committedThenDied(t, s, "week")
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
	// The record is completed: its mark is no longer needed.
	if _, err := later.Sweep(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	if n := markRows(t, db); n != 0 {
		t.Errorf("%d commit marks after the record completed and a sweep, want 0", n)
	}
}

// TestSweepPassesMarksStillNeeded: marks a processing record still needs
// (TestSweepKeepsMarkOfProcessingRecord) must not keep Sweep from the
// unneeded marks behind them. With a batch of one, the oldest mark is
// needed; the next, whose record a retry completed, must still go.
func TestSweepPassesMarksStillNeeded(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	var reqs []storekit.ClaimRequest
	for _, key := range []string{"held", "done"} { // "held" gets the smaller token
		reqs = append(reqs, committedThenDied(t, s, key))
	}
	later := openStore(t, db, withClockOffset(2*24*time.Hour))
	if res, err := later.Claim(t.Context(), reqs[1]); err != nil || res.Claimed {
		t.Fatalf("retry of done: %+v, %v; want completed from its mark", res, err)
	}
	for range 3 {
		if _, err := later.Sweep(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := markRows(t, db); n != 1 {
		t.Errorf("%d commit marks after sweeps of one, want 1 (the one the processing record needs): a needed mark blocks the sweep", n)
	}
}

// committedThenDied claims key with a week's retention, books its ledger
// row in the lease's Tx and commits that transaction itself; then the
// process "dies": no Complete, the record stays processing. It returns
// the request, for the retry.
func committedThenDied(t *testing.T, s *Store, key string) storekit.ClaimRequest {
	t.Helper()
	req := claimReq(key, time.Minute)
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
	return req
}
