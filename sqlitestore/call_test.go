package sqlitestore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/calltest"
)

// TestCallConformance runs Engine.Call's suite on SQLite, a fresh database
// file per test.
func TestCallConformance(t *testing.T) {
	calltest.Run(t, func(tb testing.TB) core.Store { return newStore(tb) })
}

// TestCallTx: writes through Tx in a call's fn commit with its result, and
// are rolled back when fn fails.
func TestCallTx(t *testing.T) {
	db, _ := newDB(t)
	s := openStore(t, db)
	ledgerTable(t, db)
	e, err := core.New(s)
	if err != nil {
		t.Fatal(err)
	}
	req := core.CallRequest{Scope: "tenant", Key: "pay-1", Name: "charge", Input: []byte("42")}
	fail := errors.New("provider down")
	_, err = e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
		if err := book(ctx, "pay-1", 1); err != nil {
			return nil, err
		}
		return nil, fail
	})
	if !errors.Is(err, fail) {
		t.Fatalf("failing call: %v", err)
	}
	if n := ledgerRows(t, db, "pay-1"); n != 0 {
		t.Fatalf("a failed call's write committed: %d rows", n)
	}
	for i := range 2 {
		res, err := e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
			return []byte("booked"), book(ctx, "pay-1", 2)
		})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Value) != "booked" || res.Replayed != (i == 1) {
			t.Fatalf("call %d: %q replayed=%v", i, res.Value, res.Replayed)
		}
	}
	if n := ledgerRows(t, db, "pay-1"); n != 1 {
		t.Fatalf("ledger rows %d, want 1", n)
	}
}

// TestCallProcesses runs Engine.Call's cross-process suite on one SQLite
// file: the children find it through the environment.
func TestCallProcesses(t *testing.T) {
	const env = "IDEM_CALLTEST_SQLITE_PATH"
	path := os.Getenv(env)
	if path == "" {
		path = filepath.Join(t.TempDir(), "calls.db")
	}
	calltest.Processes(t, func(tb testing.TB) core.Store {
		db, err := OpenDB(context.Background(), path)
		if err != nil {
			tb.Fatalf("open: %v", err)
		}
		tb.Cleanup(func() { _ = db.Close() })
		return openStore(tb, db)
	}, env+"="+path)
}
