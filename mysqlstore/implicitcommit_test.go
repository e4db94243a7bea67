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

// implicitCommits are statements a handler might run on its Tx that make
// the server commit the transaction behind database/sql's back (and go on
// in autocommit): the commit mark and the writes before it land, whatever
// idem decides.
var implicitCommits = map[string][]string{
	"DDL":         {"CREATE TABLE audit (n INT)"},
	"LOCK TABLES": {"LOCK TABLES ledger WRITE", "UNLOCK TABLES"},
	// Sent as SQL, BEGIN commits it and begins another, which the rest of
	// the handler's statements join. (COMMIT sent as SQL: txtest.)
	"BEGIN": {"BEGIN", "INSERT INTO ledger (k, owner) VALUES ('after-begin', 0)"},
}

// bookThenCommitImplicitly runs the handler of key: the ledger row on its
// Tx, then stmts on the same transaction.
func bookThenCommitImplicitly(t *testing.T, hctx context.Context, key string, token int64, stmts []string) {
	t.Helper()
	if err := book(hctx, key, token); err != nil {
		t.Fatal(err)
	}
	tx, err := Tx(hctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(hctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// assertNeverReleased checks, for a key whose ledger row committed, that
// no retry can run the handler again: the record is not failed, and once
// its lease has lapsed a claim does not take it over.
func assertNeverReleased(t *testing.T, s *Store, req storekit.ClaimRequest) {
	t.Helper()
	if n := ledgerRows(t, s.db, req.Key); n != 1 {
		t.Fatalf("%d ledger rows, want 1 (the writes committed implicitly)", n)
	}
	rec, err := s.Get(t.Context(), req.Scope, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status == storekit.StatusFailed {
		t.Fatalf("record failed (released) although its ledger row committed: a retry runs the payment again")
	}
	later := openStore(t, s.db, withClockOffset(10*time.Minute))
	res, err := later.Claim(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Claimed {
		t.Fatalf("a retry took the key over (token %d) although its ledger row committed: the payment runs again", res.Record.Token)
	}
	if res.Record.Status != storekit.StatusCompleted {
		t.Fatalf("retry answered %s, want completed", res.Record.Status)
	}
}

// TestTxImplicitCommitThenFail: the handler's Tx was committed by the
// server (DDL, LOCK TABLES) and the handler then fails. database/sql still
// believes the transaction open and its Rollback succeeds, but the ledger
// row committed: Fail must not release the key; it completes the record as
// not retained, as for a handler that committed itself.
func TestTxImplicitCommitThenFail(t *testing.T) {
	for name, stmts := range implicitCommits {
		t.Run(name, func(t *testing.T) {
			db := mysqlstoretest.NewDB(t, "")
			s := openStore(t, db)
			ledgerTable(t, db)
			req := claimReq("k", time.Minute)
			hctx, f := handlerCtx(t, s, req)
			bookThenCommitImplicitly(t, hctx, req.Key, f.Token, stmts)
			if err := s.Fail(hctx, f); err != nil {
				t.Fatalf("fail: %v", err)
			}
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != storekit.StatusCompleted || rec.Response == nil || !rec.Response.NotRetained {
				t.Errorf("record %s %+v, want completed as not retained", rec.Status, rec.Response)
			}
			assertNeverReleased(t, s, req)
		})
	}
}

// TestTxImplicitCommitThenComplete: the handler's Tx was committed by the
// server, and the handler answers 201: the response is recorded (the
// writes are in), exactly one ledger row.
func TestTxImplicitCommitThenComplete(t *testing.T) {
	for name, stmts := range implicitCommits {
		t.Run(name, func(t *testing.T) {
			db := mysqlstoretest.NewDB(t, "")
			s := openStore(t, db)
			ledgerTable(t, db)
			req := claimReq("k", time.Minute)
			hctx, f := handlerCtx(t, s, req)
			bookThenCommitImplicitly(t, hctx, req.Key, f.Token, stmts)
			if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
				t.Fatalf("complete: %v", err)
			}
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || rec.Response.Status != 201 {
				t.Fatalf("record %s %+v %v, want completed 201", rec.Status, rec.Response, err)
			}
			if n := ledgerRows(t, db, req.Key); n != 1 {
				t.Errorf("%d ledger rows, want 1", n)
			}
			if n := markRows(t, db); n != 0 {
				t.Errorf("%d commit marks left, want 0", n)
			}
		})
	}
}

// TestTxImplicitCommitThenCompleteFails: the handler's Tx was committed by
// the server, and the Complete that would record its response fails (its
// connection is killed while the fenced update waits for the record's
// row). The key must not be released, by Complete's clean-up or later:
// the writes are in, and a retry would run them again. The commit mark
// must survive the failed Complete, so that the claim that takes the
// lapsed lease over completes the record as not retained.
func TestTxImplicitCommitThenCompleteFails(t *testing.T) {
	for name, stmts := range implicitCommits {
		t.Run(name, func(t *testing.T) {
			cfg := mysqlstoretest.Database(t, "")
			db := mysqlstoretest.Open(t, cfg)
			admin := mysqlstoretest.Open(t, mysqlstoretest.Config(t, ""))
			s := openStore(t, db)
			ledgerTable(t, db)
			req := claimReq("k", time.Minute)
			hctx, f := handlerCtx(t, s, req)
			bookThenCommitImplicitly(t, hctx, req.Key, f.Token, stmts)
			// Another session holds the record's row: the fenced update
			// waits, and is killed there; the row is let go afterwards, so
			// Complete's clean-up runs unhindered.
			lock, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lock.Exec("SELECT token FROM idem_records WHERE scope = ? AND `key` = ? FOR UPDATE", req.Scope, req.Key); err != nil {
				t.Fatal(err)
			}
			killed := killWhenRunning(t, admin, cfg.DBName, "UPDATE `idem_records` SET status = 'completed'%", func() { _ = lock.Rollback() })
			err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
			if kerr := <-killed; kerr != nil {
				t.Fatalf("kill: %v", kerr)
			}
			if err == nil || errors.Is(err, core.ErrLeaseLost) {
				t.Fatalf("complete = %v, want the connection's loss", err)
			}
			assertNeverReleased(t, s, req)
		})
	}
}

// killWhenRunning kills, from admin, the connection to database dbName
// running a statement whose text is like pattern (SQL LIKE), once it shows
// in the processlist, then calls then. The result (nil once killed)
// arrives on the channel; it gives up after 20s.
func killWhenRunning(t *testing.T, admin *sql.DB, dbName, pattern string, then func()) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		defer then()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			var id int64
			err := admin.QueryRow("SELECT id FROM information_schema.processlist WHERE db = ? AND info LIKE ? AND id <> CONNECTION_ID()",
				dbName, pattern).Scan(&id)
			if errors.Is(err, sql.ErrNoRows) {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			if err == nil {
				_, err = admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id))
			}
			done <- err
			return
		}
		done <- fmt.Errorf("no statement like %q showed in the processlist", pattern)
	}()
	return done
}
