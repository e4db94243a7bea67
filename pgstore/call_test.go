package pgstore

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/calltest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestCallConformance runs Engine.Call's suite on PostgreSQL, in every
// retention mode and in transactional mode.
func TestCallConformance(t *testing.T) {
	all := append(modes[:len(modes):len(modes)], struct {
		name string
		opts []Option
	}{"transactional", []Option{WithTransactional()}})
	for _, m := range all {
		t.Run(m.name, func(t *testing.T) {
			pool := pgstoretest.Pool(t)
			calltest.Run(t, func(tb testing.TB) core.Store { return newStore(tb, pool, m.opts...) })
		})
	}
}

// TestCallTx: writes through Tx in a call's fn commit with its result, and
// are rolled back when fn fails.
func TestCallTx(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t), WithTransactional())
	table := ledger(t, s)
	e, err := core.New(s)
	if err != nil {
		t.Fatal(err)
	}
	req := core.CallRequest{Scope: "tenant", Key: "pay-1", Name: "charge", Input: []byte("42")}
	fail := errors.New("provider down")
	_, err = e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
		if err := handle(ctx, table, "pay-1"); err != nil {
			return nil, err
		}
		return nil, fail
	})
	if !errors.Is(err, fail) {
		t.Fatalf("failing call: %v", err)
	}
	if rows := ledgerRows(t, s, table, "pay-1"); len(rows) != 0 {
		t.Fatalf("a failed call's write committed: %v", rows)
	}
	for range 2 {
		if _, err := e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
			return []byte("booked"), handle(ctx, table, "pay-1")
		}); err != nil {
			t.Fatal(err)
		}
	}
	if rows := ledgerRows(t, s, table, "pay-1"); len(rows) != 1 {
		t.Fatalf("ledger rows %v, want 1", rows)
	}
}

// TestCallProcesses runs Engine.Call's cross-process suite on PostgreSQL:
// the children reach the parent's schema through the environment.
func TestCallProcesses(t *testing.T) {
	const env = "IDEM_CALLTEST_PG_SCHEMA"
	pool := pgstoretest.Pool(t)
	schema := os.Getenv(env)
	if schema == "" {
		schema = pgstoretest.Schema(t, pool)
	}
	calltest.Processes(t, func(tb testing.TB) core.Store { return openStore(tb, pool, WithSchema(schema)) }, env+"="+schema)
}
