package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/pgstore/pgstoretest"
)

func TestMain(m *testing.M) {
	// No ignores: every test closes its pools (pgstoretest registers Close in
	// Cleanup), and a closed pgxpool leaves no goroutine behind.
	goleak.VerifyTestMain(m)
}

// modes are the two retention modes every behavioural test runs in.
var modes = []struct {
	name string
	opts []Option
}{
	{"plain", nil},
	{"partitioned", []Option{WithPartitioning(2)}},
}

// newStore migrates a fresh schema on pool and returns a store on it.
func newStore(tb testing.TB, pool *pgxpool.Pool, opts ...Option) *Store {
	tb.Helper()
	schema := pgstoretest.Schema(tb, pool)
	opts = append([]Option{WithSchema(schema)}, opts...)
	return openStore(tb, pool, opts...)
}

// openStore migrates (idempotently) and opens a store with exactly opts.
func openStore(tb testing.TB, pool *pgxpool.Pool, opts ...Option) *Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Migrate(ctx, pool, opts...); err != nil {
		tb.Fatalf("migrate: %v", err)
	}
	s, err := New(pool, opts...)
	if err != nil {
		tb.Fatalf("new: %v", err)
	}
	tb.Cleanup(s.Close) // runs before the pool's Close (registered earlier)
	return s
}

// dbNow reads the database clock.
func dbNow(tb testing.TB, pool *pgxpool.Pool) time.Time {
	tb.Helper()
	var now time.Time
	if err := pool.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		tb.Fatalf("read database clock: %v", err)
	}
	return now
}
