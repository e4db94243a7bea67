package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/core/storekit/sqlkit"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migration is one versioned step, its SQL rendered for a configuration.
type migration struct {
	version int
	name    string
	stmts   []string
}

func loadMigrations(c config) ([]migration, error) {
	n := c.names()
	data := map[string]string{
		"Table": n.table, "Tokens": n.tokens, "Steps": n.steps, "TxMarks": n.txMarks,
		"ExpiresIdx": n.expiresIdx, "TrgComplete": n.trgComplete, "TrgDelete": n.trgDelete,
	}
	files, err := sqlkit.LoadMigrations(migrationFS, data, "migrations")
	if err != nil {
		return nil, err
	}
	out := make([]migration, len(files))
	for i, f := range files {
		out[i] = migration{version: f.Version, name: f.Name, stmts: sqlkit.Statements(f.SQL)}
	}
	return out, nil
}

// Migrate creates or upgrades the store's tables in the database db opens
// and switches the file to WAL mode (a persistent setting of the file).
// Pass the options New gets. It is idempotent and safe to run from several
// processes at once: each migration runs in one BEGIN IMMEDIATE
// transaction, which SQLite serialises across processes, and is skipped
// when the version table already lists it.
func Migrate(ctx context.Context, db *sql.DB, opts ...Option) error {
	if db == nil {
		return errors.New("sqlitestore: migrate: db is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	migs, err := loadMigrations(cfg)
	if err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode); err != nil {
		return wrap(ctx, "migrate: journal_mode", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("sqlitestore: migrate: journal_mode is %q, not wal (an in-memory database? the store needs a file)", mode)
	}
	n := cfg.names()
	return withImmediate(ctx, db, func(conn *sql.Conn) error {
		if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+n.migrations+
			" (table_name TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL, PRIMARY KEY (table_name, version))"); err != nil {
			return wrap(ctx, "migrate: version table", err)
		}
		for _, m := range migs {
			var done int
			if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+n.migrations+" WHERE table_name = ? AND version = ?",
				cfg.Table, m.version).Scan(&done); err != nil {
				return wrap(ctx, "migrate: read versions", err)
			}
			if done > 0 {
				continue
			}
			for _, st := range m.stmts {
				if _, err := conn.ExecContext(ctx, st); err != nil {
					return wrap(ctx, "migrate: "+m.name, err)
				}
			}
			if _, err := conn.ExecContext(ctx, "INSERT INTO "+n.migrations+" (table_name, version, name) VALUES (?, ?, ?)",
				cfg.Table, m.version, m.name); err != nil {
				return wrap(ctx, "migrate: record "+m.name, err)
			}
		}
		return nil
	})
}

// withImmediate runs fn on one connection inside BEGIN IMMEDIATE ...
// COMMIT, whatever the DSN's _txlock says: the write lock is taken first,
// so two processes migrating at once run one after the other.
func withImmediate(ctx context.Context, db *sql.DB, fn func(*sql.Conn) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return wrap(ctx, "migrate: connection", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return wrap(ctx, "migrate: begin", err)
	}
	if err := fn(conn); err != nil {
		// Detached: a cancelled ctx must not leave the connection in a
		// transaction. A failed ROLLBACK discards the connection.
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		return wrap(ctx, "migrate: commit", err)
	}
	return nil
}
