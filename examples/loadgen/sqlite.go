package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idem/sqlitestore"
)

// SQLite behind the servers (-dsn sqlite://DIR, DIR empty for the
// temporary directory): examples/payments runs sqlitestore (its embedded
// default), the baseline and the article's design write with database/sql
// through sqlitestore.OpenDB (WAL, synchronous=FULL: the same durability)
// on one connection, as an application that writes SQLite from one process
// would (concurrent writers would otherwise meet SQLite's busy-handler
// sleeps). Each server gets a fresh file, removed at the end; -pool does
// not apply.

const sqliteScheme = "sqlite://"

func isSQLite(dsn string) bool { return strings.HasPrefix(dsn, sqliteScheme) }

// newSQLiteFile returns a fresh file path under the DSN's directory and a
// function removing it (and its WAL and shared-memory files).
func newSQLiteFile(dsn string) (string, func(), error) {
	dir := strings.TrimPrefix(dsn, sqliteScheme)
	if dir == "" {
		dir = os.TempDir()
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", nil, errors.New("-dsn sqlite://DIR: DIR must be an existing directory")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	path := filepath.Join(dir, "loadgen_"+hex.EncodeToString(b[:])+".db")
	return path, func() {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			_ = os.Remove(path + suffix)
		}
	}, nil
}

// sqliteLedger opens the file a sqlite:// DSN names on one connection,
// creates the ledger table (and the article's for kind "article"), and
// returns the ledger insert and the database.
func sqliteLedger(ctx context.Context, dsn, kind string) (func(ctx context.Context, args ...any) error, *sql.DB, error) {
	db, err := sqlitestore.OpenDB(ctx, strings.TrimPrefix(dsn, sqliteScheme))
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(1)
	ddl := []string{`CREATE TABLE IF NOT EXISTS payments (
	id                 TEXT    PRIMARY KEY,
	user_id            TEXT    NOT NULL,
	amount             INTEGER NOT NULL CHECK (amount > 0),
	currency           TEXT    NOT NULL,
	recipient          TEXT    NOT NULL,
	provider_charge_id TEXT    NOT NULL,
	created_at         INTEGER NOT NULL DEFAULT (unixepoch())
)`, `CREATE INDEX IF NOT EXISTS payments_user_idx ON payments (user_id, created_at, id)`}
	if kind == "article" {
		ddl = append(ddl, articleDDL("idempotency_keys", articleSQLite)...)
	}
	for _, q := range ddl {
		if _, err := db.ExecContext(ctx, q); err != nil {
			_ = db.Close()
			return nil, nil, err
		}
	}
	insert := `INSERT INTO payments (id, user_id, amount, currency, recipient, provider_charge_id) VALUES (?, ?, ?, ?, ?, ?)`
	return func(ctx context.Context, args ...any) error {
		_, err := db.ExecContext(ctx, insert, args...)
		return err
	}, db, nil
}
