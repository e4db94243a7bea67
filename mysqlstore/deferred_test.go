package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
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
