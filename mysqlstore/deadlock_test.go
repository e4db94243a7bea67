package mysqlstore

import (
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestTxDeadlockIgnored: a statement of the handler's Tx transaction is
// chosen as a deadlock victim (1213): the server rolls the whole
// transaction back, commit mark and ledger row included, and goes on in
// autocommit. The handler ignores the error, books another row (it
// autocommits) and answers 201. Complete must not record that 201, nor
// release the key (a retry would book again): not retained.
func TestTxDeadlockIgnored(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db, WithDeadlockRetries(0))
	ledgerTable(t, db)
	if _, err := db.Exec("CREATE TABLE stock (id INT PRIMARY KEY, n INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO stock VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	req := claimReq("k", time.Minute)
	hctx, f := handlerCtx(t, s, req)
	if err := book(hctx, req.Key, f.Token); err != nil {
		t.Fatal(err)
	}
	tx, err := Tx(hctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(hctx, "UPDATE stock SET n = n + 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	// The other session locks row 2, writes more than the handler (so the
	// handler is the victim), then waits for row 1.
	other, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if _, err := other.Exec("UPDATE stock SET n = n + 1 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := other.Exec("INSERT INTO ledger (k, owner) VALUES (?, 0)", "other-"+string(rune('A'+i))); err != nil {
			t.Fatal(err)
		}
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := other.Exec("UPDATE stock SET n = n + 1 WHERE id = 1")
		waiting <- err
	}()
	// Once the other session waits for row 1, the handler's request for
	// row 2 closes the cycle. Poll until it waits (bounded; the processlist,
	// not innodb_lock_waits, which InnoDB caches while it is read often).
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.processlist WHERE info = 'UPDATE stock SET n = n + 1 WHERE id = 1'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other session never waited for row 1")
		}
		time.Sleep(2 * time.Millisecond)
	}
	_, err = tx.ExecContext(hctx, "UPDATE stock SET n = n + 1 WHERE id = 2")
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1213 {
		t.Fatalf("handler's statement = %v, want the deadlock (1213)", err)
	}
	if err := <-waiting; err != nil {
		t.Fatalf("other session: %v", err)
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	// The handler ignores the deadlock, books on (in autocommit now, as
	// database/sql cannot tell) and answers 201.
	if n := ledgerRows(t, db, req.Key); n != 0 {
		t.Fatalf("%d ledger rows after the deadlock, want 0 (rolled back)", n)
	}
	if err := book(hctx, req.Key, f.Token); err != nil {
		t.Fatal(err)
	}
	err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	if !errors.Is(err, ErrTxRolledByServer) {
		t.Errorf("complete = %v, want ErrTxRolledByServer", err)
	}
	assertNeverReleased(t, s, req)
}
