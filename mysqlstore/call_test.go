package mysqlstore

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/calltest"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestCallConformance runs Engine.Call's suite on MariaDB/MySQL.
func TestCallConformance(t *testing.T) {
	calltest.Run(t, func(tb testing.TB) core.Store { return newStore(tb) })
}

// TestCallTx: writes through Tx in a call's fn commit with its result, and
// are rolled back when fn fails.
func TestCallTx(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM ledger").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	book := func(ctx context.Context) error {
		tx, err := Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO ledger (k) VALUES ('pay-1')")
		return err
	}
	e, err := core.New(s)
	if err != nil {
		t.Fatal(err)
	}
	req := core.CallRequest{Scope: "tenant", Key: "pay-1", Name: "charge", Input: []byte("42")}
	fail := errors.New("provider down")
	if _, err := e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
		if err := book(ctx); err != nil {
			return nil, err
		}
		return nil, fail
	}); !errors.Is(err, fail) {
		t.Fatalf("failing call: %v", err)
	}
	if n := count(); n != 0 {
		t.Fatalf("a failed call's write committed: %d rows", n)
	}
	for range 2 {
		if _, err := e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
			return []byte("booked"), book(ctx)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("ledger rows %d, want 1", n)
	}
}

// TestCallProcesses runs Engine.Call's cross-process suite on MariaDB/MySQL:
// the children reach the parent's database through the environment.
func TestCallProcesses(t *testing.T) {
	const env = "IDEM_CALLTEST_MY_DB"
	name := os.Getenv(env)
	var cfg = mysqlstoretest.Config(t, "")
	if name == "" {
		cfg = mysqlstoretest.Database(t, "")
	} else {
		cfg.DBName = name
	}
	db := mysqlstoretest.Open(t, cfg)
	calltest.Processes(t, func(tb testing.TB) core.Store { return openStore(tb, db) }, env+"="+cfg.DBName)
}
