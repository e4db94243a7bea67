package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemkit/idem/sqlitestore"
)

// sqliteLedger is the ledger table in the store's SQLite file. Record
// queues the row with sqlitestore.Defer: it is inserted in the transaction
// idem commits together with the stored response, so the row and the
// idempotency record are one atomic fact, and SQLite's only write lock is
// taken at that commit, not held while the handler runs. A stale owner's
// fenced commit fails and its row rolls back with it; a row the database
// refuses fails the commit (500, key released), as with Tx.
type sqliteLedger struct {
	db *sql.DB
}

const (
	// memDSN selects the in-memory store and ledger (memstore): tests,
	// and anything that starts several instances side by side.
	memDSN = "mem:"
	// sqliteScheme selects sqlitestore on the file that follows.
	sqliteScheme = "sqlite://"
)

// defaultSQLitePath is where the embedded default keeps its keys and
// ledger: idem/payments.db under the user's cache directory ($XDG_CACHE_HOME
// or ~/.cache on Linux, ~/Library/Caches on macOS, %LocalAppData% on
// Windows), else under the temporary directory. Not the working
// directory: `go run ./examples/payments` from a clone would leave a
// database in the source tree, and a restart from another directory would
// not find its keys. It is demo data: deleting it forgets the keys.
func defaultSQLitePath() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "idem", "payments.db")
}

// sqlitePath returns the database file -dsn selects: sqlite://PATH, or
// the default when -dsn is empty. ok is false for other DSNs.
func sqlitePath(dsn string) (path string, ok bool) {
	if dsn == "" {
		return defaultSQLitePath(), true
	}
	if p, ok := strings.CutPrefix(dsn, sqliteScheme); ok {
		return p, true
	}
	return "", false
}

// openSQLite opens (creating it and its directory if needed) the SQLite
// file, migrates the store and the ledger, and builds both.
func openSQLite(ctx context.Context, path string, margin time.Duration) (*sql.DB, *sqlitestore.Store, *sqliteLedger, error) {
	if path == "" {
		return nil, nil, nil, fmt.Errorf("-dsn %s: want %sPATH", sqliteScheme, sqliteScheme)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("-dsn: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	db, err := sqlitestore.OpenDB(cctx, path)
	if err != nil {
		return nil, nil, nil, err
	}
	fail := func(err error) (*sql.DB, *sqlitestore.Store, *sqliteLedger, error) {
		_ = db.Close()
		return nil, nil, nil, err
	}
	if err := sqlitestore.Migrate(cctx, db); err != nil {
		return fail(err)
	}
	store, err := sqlitestore.New(db, sqlitestore.WithRetentionMargin(margin))
	if err != nil {
		return fail(err)
	}
	ledger := &sqliteLedger{db: db}
	if err := ledger.migrate(cctx); err != nil {
		return fail(fmt.Errorf("ledger migration: %w", err))
	}
	return db, store, ledger, nil
}

// migrate creates the ledger table (CREATE TABLE IF NOT EXISTS is atomic:
// instances starting together need no lock). Ids and users compare byte for
// byte (SQLite's default BINARY collation).
func (l *sqliteLedger) migrate(ctx context.Context) error {
	_, err := l.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS payments (
  id                 TEXT    NOT NULL PRIMARY KEY,
  user_id            TEXT    NOT NULL,
  amount             INTEGER NOT NULL CHECK (amount > 0),
  currency           TEXT    NOT NULL,
  recipient          TEXT    NOT NULL,
  provider_charge_id TEXT    NOT NULL,
  created_at         INTEGER NOT NULL DEFAULT (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
);
CREATE INDEX IF NOT EXISTS payments_user_idx ON payments (user_id, created_at, id)`)
	return err
}

// Record queues the row's insert with sqlitestore.Defer: it runs in the
// transaction that stores the response.
func (l *sqliteLedger) Record(ctx context.Context, user string, p Payment) error {
	err := sqlitestore.Defer(ctx, "INSERT INTO payments (id, user_id, amount, currency, recipient, provider_charge_id) VALUES (?, ?, ?, ?, ?, ?)",
		p.ID, user, p.Amount, p.Currency, p.To, p.ProviderChargeID)
	if err != nil {
		return fmt.Errorf("ledger: insert: %w", err)
	}
	return nil
}

// List reads committed rows only: a payment in flight is not listed.
func (l *sqliteLedger) List(ctx context.Context, user string) ([]Payment, error) {
	rows, err := l.db.QueryContext(ctx, "SELECT id, amount, currency, recipient, provider_charge_id, created_at "+
		"FROM payments WHERE user_id = ? ORDER BY created_at, id", user)
	if err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	defer rows.Close()
	ps := []Payment{}
	for rows.Next() {
		var p Payment
		var us int64
		if err := rows.Scan(&p.ID, &p.Amount, &p.Currency, &p.To, &p.ProviderChargeID, &us); err != nil {
			return nil, fmt.Errorf("ledger: list: %w", err)
		}
		p.CreatedAt = time.UnixMicro(us).UTC()
		ps = append(ps, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	return ps, nil
}
