package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core/storekit/sqlkit"
)

//go:embed migrations
var migrationFS embed.FS

// lockKey is the pg_advisory_xact_lock key serialising Migrate and
// partition maintenance across every instance sharing the database
// ("idemlock" in ASCII). Both are rare and short, so one key for all
// schemas and tables is simpler than a key per table and costs nothing.
const lockKey int64 = 0x6964656d6c6f636b

// migration is one versioned step, its SQL rendered for a configuration.
type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations renders the migrations of c's mode: those in
// migrations/<mode> and those both modes share, in migrations/both, in one
// sequence of versions.
func loadMigrations(c config) ([]migration, error) {
	n := c.names()
	into, err := claimFullIntoSQL(c)
	if err != nil {
		return nil, err
	}
	data := map[string]string{
		"Schema":         n.schema,
		"Table":          n.table,
		"Seq":            n.seq,
		"ExpiresIdx":     n.expiresIdx,
		"Payload":        n.payload,
		"PayloadDefault": n.payloadDef,
		"PayloadIdx":     n.payloadIdx,
		"ClaimFn":        n.claimFn,
		"ClaimFull":      claimFullSQL(c),
		"ClaimRowFn":     n.claimRowFn,
		"ClaimRowType":   n.claimRow,
		"ClaimFullInto":  into,
		"Steps":          stepsTable(c),       // 0005
		"ClaimReadInto":  claimReadIntoSQL(c), // 0006
	}
	files, err := sqlkit.LoadMigrations(migrationFS, data, path.Join("migrations", c.mode()), path.Join("migrations", "both"))
	if err != nil {
		return nil, err
	}
	out := make([]migration, len(files))
	for i, f := range files {
		out[i] = migration{version: f.Version, name: f.Name, sql: f.SQL}
	}
	return out, nil
}

// migrationsTableSQL creates the table recording applied migrations (one
// per schema, shared by the store tables in it).
func migrationsTableSQL(n names) string {
	return `CREATE TABLE IF NOT EXISTS ` + n.migrations + ` (
    table_name text        NOT NULL,
    version    integer     NOT NULL,
    mode       text        NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version)
)`
}

// Migrate creates or upgrades the store's schema objects: the schema (if
// missing), the sequence, the tables and indexes, from SQL files embedded in
// the binary and versioned in a table idem_schema_migrations in the same
// schema. Pass the same options as to New. In partitioned mode it also
// creates the payload partitions for today and the configured days ahead.
//
// Migrate is idempotent and safe to run concurrently from several instances
// at start-up: everything happens in one transaction holding a
// transaction-level advisory lock (pg_advisory_xact_lock), so one instance
// applies the pending steps and the others then find nothing to do. It
// refuses to switch an existing table between the plain and partitioned
// modes.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	if pool == nil {
		return errors.New("pgstore: migrate: pool is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	migs, err := loadMigrations(cfg)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return migrateTx(ctx, tx, cfg, migs)
	})
	if err != nil {
		return wrap(ctx, "migrate", err)
	}
	return nil
}

func migrateTx(ctx context.Context, tx pgx.Tx, cfg config, migs []migration) error {
	n := cfg.names()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
		return fmt.Errorf("advisory lock: %w", err)
	}
	// After the lock: concurrent CREATE ... IF NOT EXISTS can still fail
	// with a unique violation in the catalogs.
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+n.schema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if _, err := tx.Exec(ctx, migrationsTableSQL(n)); err != nil {
		return fmt.Errorf("create migrations table: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT version, mode FROM `+n.migrations+` WHERE table_name = $1`, cfg.table)
	if err != nil {
		return fmt.Errorf("read applied migrations: %w", err)
	}
	applied := map[int]bool{}
	var v int
	var mode string
	_, err = pgx.ForEachRow(rows, []any{&v, &mode}, func() error {
		if mode != cfg.mode() {
			return fmt.Errorf("table %s.%s was created in %s mode, options ask for %s mode", cfg.schema, cfg.table, mode, cfg.mode())
		}
		applied[v] = true
		return nil
	})
	if err != nil {
		return err
	}
	for _, m := range migs {
		if applied[m.version] {
			continue
		}
		// No arguments: pgx sends the file over the simple protocol, so
		// it may hold several statements.
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("apply %s (%s mode): %w", m.name, cfg.mode(), err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+n.migrations+` (table_name, version, mode, name) VALUES ($1, $2, $3, $4)`,
			cfg.table, m.version, cfg.mode(), m.name); err != nil {
			return fmt.Errorf("record %s: %w", m.name, err)
		}
	}
	if cfg.partitioned {
		var now time.Time
		if err := tx.QueryRow(ctx, buildStatements(cfg).now).Scan(&now); err != nil {
			return fmt.Errorf("read clock: %w", err)
		}
		for d := 0; d <= cfg.daysAhead; d++ {
			if err := ensurePartition(ctx, tx, cfg, now.AddDate(0, 0, d)); err != nil {
				return err
			}
		}
	}
	return nil
}
