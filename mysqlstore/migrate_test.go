package mysqlstore

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestMigrateConcurrent: several instances migrating one fresh database at
// once all succeed, and the schema is there once.
func TestMigrateConcurrent(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := Migrate(t.Context(), db); err != nil {
				t.Errorf("concurrent migrate: %v", err)
			}
		}()
	}
	wg.Wait()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM idem_schema_migrations WHERE table_name = 'idem_records'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 7 {
		t.Errorf("%d migrations recorded, want 7", n)
	}
	// Again: nothing to do.
	if err := Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	s, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if res, err := s.Claim(t.Context(), claimReq("k", time.Minute)); err != nil || !res.Claimed {
		t.Fatalf("claim after migrate: %v", err)
	}
}

// TestNotMigrated: a store on a database without its schema says what to do.
func TestNotMigrated(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Claim(t.Context(), claimReq("secret-key", time.Minute))
	if err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("claim on an empty database: %v, want advice to run Migrate", err)
	}
	if strings.Contains(err.Error(), "secret-key") {
		t.Errorf("error carries the idempotency key: %v", err)
	}
}

func TestOptionsInvalid(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	for _, opts := range [][]Option{
		{WithTable("")},
		{WithTable("bad-name")},
		{WithTable(strings.Repeat("x", 41))},
		{WithRetentionMargin(-time.Second)},
		{WithTxPool(nil)},
		{WithDeadlockRetries(-1)},
	} {
		if _, err := New(db, opts...); err == nil {
			t.Errorf("New accepted invalid options")
		}
		if err := Migrate(t.Context(), db, opts...); err == nil {
			t.Errorf("Migrate accepted invalid options")
		}
	}
	if _, err := New(nil); err == nil {
		t.Error("New(nil) accepted")
	}
	if _, err := New(db, nil, WithTable("ok_name")); err != nil {
		t.Errorf("nil option: %v", err)
	}
}
