package mysqlstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestTakeoverAfterHandlerCommitted: a handler commits the lease
// transaction itself and its process dies before Complete. Its writes and
// its commit mark are committed under a record still processing; when the
// lease lapses, a retry must not run the handler again: the claim finds
// the mark of the token it would take over from and completes the record
// as not retained (retries answer 409 not-retained). A crash whose writes
// rolled back (no mark) is taken over as usual.
func TestTakeoverAfterHandlerCommitted(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ledgerTable(t, db)
	lapse := func(key string) {
		t.Helper()
		if _, err := db.Exec("UPDATE idem_records SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE `key` = ?", key); err != nil {
			t.Fatal(err)
		}
	}
	for _, committed := range []bool{true, false} {
		key := "rolled-back"
		if committed {
			key = "committed"
		}
		hctx, f := handlerCtx(t, s, claimReq(key, time.Hour))
		if err := book(hctx, key, f.Token); err != nil {
			t.Fatal(err)
		}
		tx, err := Tx(hctx)
		if err != nil {
			t.Fatal(err)
		}
		if committed {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		// The process dies here: no Complete, no Fail.
		lapse(key)
		res, err := s.Claim(t.Context(), claimReq(key, time.Hour))
		if err != nil {
			t.Fatalf("%s: claim after the lapse: %v", key, err)
		}
		if !committed {
			if !res.Claimed || res.Record.Token <= f.Token {
				t.Errorf("%s: the writes rolled back, want a takeover: claimed=%v token=%d", key, res.Claimed, res.Record.Token)
			}
			continue
		}
		if res.Claimed {
			t.Errorf("%s: the handler's writes committed (ledger rows: %d), yet the claim took the key over (token %d): the handler would run twice",
				key, ledgerRows(t, db, key), res.Record.Token)
			continue
		}
		r := res.Record
		if r.Status != storekit.StatusCompleted || r.Token != f.Token || r.Response == nil ||
			r.Response.Status != 500 || !r.Response.NotRetained {
			t.Errorf("%s: answered %s token %d response %+v; want completed under token %d, 500 not retained",
				key, r.Status, r.Token, r.Response, f.Token)
		}
		// A retry replays it.
		again, err := s.Claim(t.Context(), claimReq(key, time.Hour))
		if err != nil || again.Claimed || again.Record.Status != storekit.StatusCompleted {
			t.Errorf("%s: retry: claimed=%v status=%s err=%v, want the completed record", key, again.Claimed, again.Record.Status, err)
		}
	}
}

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
