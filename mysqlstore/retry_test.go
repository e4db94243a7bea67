package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestWithRetry: 1213 (deadlock, Galera certification conflict) and 1205
// are retried up to the configured count; other errors are not.
func TestWithRetry(t *testing.T) {
	s, err := New(&sql.DB{}, WithDeadlockRetries(3))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err   error
		calls int
	}{
		{&mysql.MySQLError{Number: 1213, Message: "Deadlock found"}, 4},
		{&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}, 4},
		{&mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}, 1},
		{errors.New("other"), 1},
	} {
		calls := 0
		err := s.withRetry(t.Context(), func() error { calls++; return c.err })
		if calls != c.calls || !errors.Is(err, c.err) {
			t.Errorf("%v: %d calls (want %d), err %v", c.err, calls, c.calls, err)
		}
	}
	calls := 0
	err = s.withRetry(t.Context(), func() error {
		calls++
		if calls < 3 {
			return &mysql.MySQLError{Number: 1213}
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("recovering: %d calls, err %v", calls, err)
	}
}

// TestClaimRetriesLockWait: a claim that has to take over a row another
// session holds locked times out (innodb_lock_wait_timeout=1 → error 1205)
// and is retried by the store until the lock goes: the caller sees a
// successful takeover, not an error.
func TestClaimRetriesLockWait(t *testing.T) {
	cfg := mysqlstoretest.Database(t, "")
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = "1"
	db := mysqlstoretest.Open(t, cfg)
	s := openStore(t, db)
	ctx := t.Context()
	req := claimReq("locked", time.Minute)
	res, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "SELECT token FROM idem_records WHERE scope = ? AND `key` = ? FOR UPDATE", req.Scope, req.Key); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(1500 * time.Millisecond) // at least one 1205 first
		_ = tx.Rollback()
	}()
	start := time.Now()
	res, err = s.Claim(ctx, req)
	if err != nil {
		t.Fatalf("claim behind a lock: %v", err)
	}
	if !res.Claimed {
		t.Fatalf("not claimed: %+v", res.Record)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("claim returned after %v: it never waited for the lock, the test proves nothing", d)
	}
}

// TestKilledConnections: the server kills every connection of the store's
// pool (KILL CONNECTION, as a failover or an operator would); the next
// statements reconnect and succeed.
func TestKilledConnections(t *testing.T) {
	cfg := mysqlstoretest.Database(t, "")
	db := mysqlstoretest.Open(t, cfg)
	db.SetMaxIdleConns(mysqlstoretest.DefaultMaxConns)
	s := openStore(t, db)
	admin := mysqlstoretest.Open(t, mysqlstoretest.Config(t, ""))
	ctx := t.Context()
	for i := range 3 {
		key := "k" + string(rune('a'+i))
		res, err := s.Claim(ctx, claimReq(key, time.Minute))
		if err != nil || !res.Claimed {
			t.Fatalf("claim %d: %v", i, err)
		}
		f := storekit.Fence{Scope: "tenant", Key: key, Token: res.Record.Token}
		killAll(t, admin, cfg.DBName)
		if err := s.Heartbeat(ctx, f, time.Minute); err != nil {
			t.Fatalf("heartbeat after KILL: %v", err)
		}
		killAll(t, admin, cfg.DBName)
		if err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201}); err != nil {
			t.Fatalf("complete after KILL: %v", err)
		}
		killAll(t, admin, cfg.DBName)
		if r, err := s.Claim(ctx, claimReq(key, time.Minute)); err != nil || r.Record.Status != storekit.StatusCompleted {
			t.Fatalf("replay after KILL: %v %v", r.Record.Status, err)
		}
	}
}

func killAll(t *testing.T, admin *sql.DB, dbName string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := admin.QueryContext(ctx, "SELECT id FROM information_schema.PROCESSLIST WHERE db = ?", dbName)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	_ = rows.Close()
	if len(ids) == 0 {
		t.Fatal("no connection to kill: the test proves nothing")
	}
	for _, id := range ids {
		if _, err := admin.ExecContext(ctx, "KILL CONNECTION ?", id); err != nil && !strings.Contains(err.Error(), "Unknown thread") {
			t.Fatal(err)
		}
	}
}
