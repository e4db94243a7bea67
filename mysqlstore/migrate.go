package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/core/storekit/sqlkit"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// lockName is the GET_LOCK name serialising Migrate across the instances
// sharing one server. Migrations are rare and short, so one name for every
// database and table is simpler than one each and costs nothing.
const lockName = "idem_migrate"

// lockWait bounds how long Migrate waits for another instance's migration.
const lockWait = 60 * time.Second

// migrationMode is the sql_mode the store's objects are created under. A
// stored procedure keeps the sql_mode of its creation, whatever the server's
// or the session's later: in particular not MariaDB's SIMULTANEOUS_ASSIGNMENT
// (the claim relies on left-to-right assignment), nor ANSI_QUOTES. Both
// modes named exist on MySQL 8.0+ and MariaDB 10.6+.
const migrationMode = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION"

// migration is one versioned step, its SQL rendered for a configuration.
type migration struct {
	version int
	name    string
	stmts   []string
}

func loadMigrations(c config) ([]migration, error) {
	n := c.names()
	data := map[string]string{
		"Table":        n.table,
		"Tokens":       n.tokens,
		"ClaimProc":    n.claimProc1,
		"ClaimProcV2":  n.claimProc2,
		"ClaimProcV3":  n.claimProc,
		"ClaimNewProc": n.claimNew,
		"ExpiresIdx":   n.expiresIdx,
		"TxMarks":      n.txMarks,
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

// migrationsTableSQL creates the table recording applied migrations (one
// per database, shared by the store tables in it).
func migrationsTableSQL(n names) string {
	return `CREATE TABLE IF NOT EXISTS ` + n.migrations + ` (
    table_name VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    version    INT          NOT NULL,
    mode       VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    name       VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    applied_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (table_name, version)
) ENGINE = InnoDB`
}

// Migrate creates or upgrades the store's tables and its claim procedure in
// the connection's current database, from SQL embedded in the binary and
// versioned in a table idem_schema_migrations. Pass the same options as to
// New.
//
// Migrate is idempotent and safe to run from several instances at once: it
// takes GET_LOCK('idem_migrate') on one pinned connection, so on one server
// a single instance applies the pending steps and the others then find
// nothing to do. MySQL's DDL is not transactional, so each step is also
// written to be re-run safely (CREATE TABLE IF NOT EXISTS; "already exists"
// answered by a concurrent instance counts as done): on Galera, where
// GET_LOCK is local to a node, instances migrating through different nodes
// at once still converge (DDL is replicated in total order).
//
// The connection Migrate used is closed at the end, not returned to the
// pool: it carried a lock and a session sql_mode.
func Migrate(ctx context.Context, db *sql.DB, opts ...Option) error {
	if db == nil {
		return errors.New("mysqlstore: migrate: db is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	migs, err := loadMigrations(cfg)
	if err != nil {
		return fmt.Errorf("mysqlstore: migrate: %w", err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return wrap(ctx, "migrate: connect", err)
	}
	defer func() {
		// Discard the connection: it may hold the lock and has our sql_mode.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
	}()
	if err := migrateConn(ctx, conn, cfg, migs); err != nil {
		return wrap(ctx, "migrate", err)
	}
	return nil
}

func migrateConn(ctx context.Context, conn *sql.Conn, cfg config, migs []migration) error {
	n := cfg.names()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lockName, int(lockWait/time.Second)).Scan(&got); err != nil {
		return fmt.Errorf("get lock %s: %w", lockName, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("get lock %s: another instance held it for %v", lockName, lockWait)
	}
	if _, err := conn.ExecContext(ctx, "SET SESSION sql_mode = '"+migrationMode+"'"); err != nil {
		return fmt.Errorf("set sql_mode: %w", err)
	}
	// On a Galera node, read the applied versions causally: another node's
	// Migrate may have committed a moment ago. (The session is discarded
	// after Migrate.)
	var vname, von string
	switch err := conn.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&vname, &von); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return fmt.Errorf("detect galera: %w", err)
	case von == "ON" || von == "1":
		if _, err := conn.ExecContext(ctx, "SET SESSION wsrep_sync_wait = 1"); err != nil {
			return fmt.Errorf("set wsrep_sync_wait: %w", err)
		}
	}
	if _, err := conn.ExecContext(ctx, migrationsTableSQL(n)); err != nil && !alreadyDone(err) {
		return fmt.Errorf("create migrations table: %w", err)
	}
	applied, err := appliedVersions(ctx, conn, cfg)
	if err != nil {
		return err
	}
	for _, m := range migs {
		if applied[m.version] {
			continue
		}
		for i, st := range m.stmts {
			if _, err := conn.ExecContext(ctx, st); err != nil && !alreadyDone(err) {
				return fmt.Errorf("apply %s (statement %d): %w", m.name, i+1, err)
			}
		}
		if _, err := conn.ExecContext(ctx, `INSERT IGNORE INTO `+n.migrations+
			` (table_name, version, mode, name, applied_at) VALUES (?, ?, 'plain', ?, UTC_TIMESTAMP(6))`,
			cfg.Table, m.version, m.name); err != nil {
			return fmt.Errorf("record %s: %w", m.name, err)
		}
	}
	return nil
}

func appliedVersions(ctx context.Context, conn *sql.Conn, cfg config) (map[int]bool, error) {
	rows, err := conn.QueryContext(ctx, `SELECT version FROM `+cfg.names().migrations+` WHERE table_name = ?`, cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	defer rows.Close()
	applied := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read applied migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	return applied, nil
}

// alreadyDone reports errors meaning a concurrent Migrate (on another
// Galera node, where GET_LOCK does not reach) created the object first.
func alreadyDone(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1050, // ER_TABLE_EXISTS_ERROR
		1060, // ER_DUP_FIELDNAME
		1061, // ER_DUP_KEYNAME
		1304: // ER_SP_ALREADY_EXISTS
		return true
	}
	return false
}
