// Package pgstores gives tests outside pgstore a migrated store in a
// fresh schema. It is separate from pgstoretest because pgstore's own
// (package-internal) tests import pgstoretest, which therefore cannot import
// pgstore.
package pgstores

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// Store migrates a fresh schema (dropped when t ends, see pgstoretest.Schema) on
// a pgstoretest pool and returns a pgstore on it, with the schema's name. An
// unreachable database or a failed migration fails t.
func Store(t testing.TB, opts ...pgstore.Option) (*pgstore.Store, string) {
	t.Helper()
	pool := pgstoretest.Pool(t)
	schema := pgstoretest.Schema(t, pool)
	opts = append([]pgstore.Option{pgstore.WithSchema(schema)}, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgstore.Migrate(ctx, pool, opts...); err != nil {
		t.Fatalf("pgstore.Migrate: %v", err)
	}
	store, err := pgstore.New(pool, opts...)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	t.Cleanup(store.Close) // its listener, if a test waited (registered after the pool's Close: runs first)
	return store, schema
}

// Ledger creates a one-column business table, ledger (note text), in the
// store's schema — what a transactional-mode handler writes with
// pgstore.Tx — and returns its quoted name and a function counting its rows.
func Ledger(t testing.TB, store *pgstore.Store, schema string) (table string, count func() int) {
	t.Helper()
	table = pgx.Identifier{schema, "ledger"}.Sanitize()
	if _, err := store.Pool().Exec(context.Background(), "CREATE TABLE "+table+" (note text NOT NULL)"); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	return table, func() int {
		t.Helper()
		var n int
		if err := store.Pool().QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatalf("count ledger: %v", err)
		}
		return n
	}
}
