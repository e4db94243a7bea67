package main

import (
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/sqlitestore"
)

// TestCompleterBooksOrphanedCharge: on each database, an owner is SIGKILLed
// after the provider charged (the charge stored as a step) and before the
// booking, and the client never retries. Within the completer's interval
// after the dead owner's lease, the other instance's completer books the
// payment: one ledger row, one provider call. The client's late retry gets
// the 201 replayed.
func TestCompleterBooksOrphanedCharge(t *testing.T) {
	bin := buildBinary(t)
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		dsn := testSQLiteDSN(t)
		checkCompleter(t, bin, dsn, sqliteStepStored(t, strings.TrimPrefix(dsn, sqliteScheme)))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dsn := testDSN(t)
		checkCompleter(t, bin, dsn, pgStepStored(t, dsn))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		cfg, dsn := testMySQL(t)
		checkCompleter(t, bin, dsn, mysqlStepStored(t, cfg))
	})
}

func checkCompleter(t *testing.T, bin, dsn string, stepStored func() bool) {
	const (
		lease    = time.Second
		interval = 200 * time.Millisecond
	)
	prov := newCountingProvider()
	srv := httptest.NewServer(prov)
	t.Cleanup(srv.Close)
	args := []string{"-dsn", dsn, "-provider-url", srv.URL, "-book-latency", "3s",
		"-completer-interval", interval.String(), "-completer-after", "0s"}
	// The owner's lease is short (the completer waits for it to lapse);
	// the other keeps the default, which a loaded host does not let lapse
	// while it finishes the payment.
	owner := startProcess(t, bin, nil, append(args, "-lease", lease.String())...)
	other := startProcess(t, bin, nil, args...)

	user, key := "u-"+randomID(), "k-"+randomID()
	body := paymentBody(4200)
	relayed := killAfterCharge(t, prov, owner, user, key, body, 2500*time.Millisecond, stepStored)

	// No retry: the completer alone books the payment, once the lease
	// lapsed, within its interval (and the booking's latency).
	waitFor(t, "the payment booked by the completer", lease+3*time.Second+10*interval+requestTimeout, func() bool {
		return len(listPayments(t, other.base, user)) > 0
	})
	calls, ids := prov.snapshot()
	if calls[relayed] != 1 || len(calls) != 1 {
		t.Errorf("provider calls %v, want exactly one, for relayed key %s", calls, relayed)
	}
	ps := listPayments(t, other.base, user)
	if len(ps) != 1 || ps[0].ProviderChargeID != ids[relayed] {
		t.Fatalf("ledger %+v, want exactly one payment with charge %s", ps, ids[relayed])
	}
	got := mustDo(t, http.MethodPost, other.base+"/v1/payments", user, key, body)
	if got.status != http.StatusCreated || !got.replayed {
		t.Fatalf("the client's late retry: %d replayed=%v %s, want the 201 replayed", got.status, got.replayed, got.body)
	}
	if !strings.Contains(string(got.body), ps[0].ID) {
		t.Errorf("the replayed 201 %s is not the booked payment %s", got.body, ps[0].ID)
	}
	if ps := listPayments(t, other.base, user); len(ps) != 1 {
		t.Errorf("ledger after the retry: %+v, want one row", ps)
	}
}

// sqliteStepStored reports whether the SQLite file at path holds a stored
// step (sqlitestore's table idem_records_steps).
func sqliteStepStored(t *testing.T, path string) func() bool {
	var db *sql.DB
	return func() bool {
		if db == nil {
			var err error
			if db, err = sqlitestore.OpenDB(t.Context(), path); err != nil {
				return false // not created yet
			}
			t.Cleanup(func() { db.Close() })
		}
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM idem_records_steps").Scan(&n); err != nil {
			return false // not migrated yet
		}
		return n > 0
	}
}
