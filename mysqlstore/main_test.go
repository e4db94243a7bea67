package mysqlstore

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

func TestMain(m *testing.M) {
	// The driver's connection watcher goroutines end when the pools close
	// (mysqlstoretest registers Close in Cleanup); nothing else may be left behind.
	goleak.VerifyTestMain(m)
}

// newStore migrates a fresh database and returns a store on it.
func newStore(tb testing.TB, opts ...Option) *Store {
	tb.Helper()
	return openStore(tb, mysqlstoretest.NewDB(tb, ""), opts...)
}

// openStore migrates (idempotently) and opens a store on db with opts.
func openStore(tb testing.TB, db *sql.DB, opts ...Option) *Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Migrate(ctx, db, opts...); err != nil {
		tb.Fatalf("migrate: %v", err)
	}
	s, err := New(db, opts...)
	if err != nil {
		tb.Fatalf("new: %v", err)
	}
	tb.Cleanup(s.Close) // runs before the pool's Close (registered earlier)
	return s
}

func claimReq(key string, lease time.Duration) storekit.ClaimRequest {
	return storekit.ClaimRequest{
		Scope: "tenant", Key: key, Method: "POST", Route: "/v1/payments",
		Fingerprint: "f1", Lease: lease, Retention: time.Hour,
	}
}

// inRetryStorm makes s read first, as it does once most keys exist: a
// claimable key goes to the claim procedure (migration 0006) straight
// after the SELECT, without a new key's insert tried first.
func inRetryStorm(s *Store) {
	for range 300 {
		s.mix.Observe(true)
	}
}
