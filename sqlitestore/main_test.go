package sqlitestore

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"
)

// newDB opens a fresh database file in tb's temporary directory, closed at
// cleanup.
func newDB(tb testing.TB) (*sql.DB, string) {
	tb.Helper()
	return newDBAt(tb, filepath.Join(tb.TempDir(), "idem.db"))
}

// newDBAt opens the database file at path, closed at cleanup.
func newDBAt(tb testing.TB, path string) (*sql.DB, string) {
	tb.Helper()
	db, err := OpenDB(context.Background(), path)
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db, path
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
	tb.Cleanup(s.Close) // before the db's Close (registered earlier)
	return s
}

// newStore is a store on a fresh database file.
func newStore(tb testing.TB, opts ...Option) *Store {
	tb.Helper()
	db, _ := newDB(tb)
	return openStore(tb, db, opts...)
}
