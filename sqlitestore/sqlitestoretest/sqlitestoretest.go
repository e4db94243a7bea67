// Package sqlitestoretest is the test kit of sqlitestore for other
// modules' tests (adapters' conformance runs, the examples): a migrated
// store on a fresh file in the test's temporary directory. Nothing to set
// up: SQLite needs no server.
package sqlitestoretest

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/sqlitestore"
)

// DB opens a fresh database file under tb.TempDir() with sqlitestore.OpenDB,
// closed when the test ends.
func DB(tb testing.TB) *sql.DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqlitestore.OpenDB(ctx, filepath.Join(tb.TempDir(), "idem.db"))
	if err != nil {
		tb.Fatalf("sqlitestoretest: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// Store migrates a fresh database file and returns a store on it with opts,
// closed when the test ends.
func Store(tb testing.TB, opts ...sqlitestore.Option) *sqlitestore.Store {
	tb.Helper()
	db := DB(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sqlitestore.Migrate(ctx, db, opts...); err != nil {
		tb.Fatalf("sqlitestoretest: migrate: %v", err)
	}
	s, err := sqlitestore.New(db, opts...)
	if err != nil {
		tb.Fatalf("sqlitestoretest: new: %v", err)
	}
	tb.Cleanup(s.Close) // before the db's Close (registered earlier)
	return s
}
