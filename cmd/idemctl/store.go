package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/sqlitestore"
)

// openStore connects to the store the DSN names and returns its operator
// interface. The retention mode is read from the store's migrations, so
// the tool needs no flag for it.
func openStore(ctx context.Context, c common) (storekit.Admin, func(), error) {
	if c.sqlite != "" {
		return openSQLite(ctx, c)
	}
	if c.mysql != "" {
		cfg, err := mysql.ParseDSN(c.mysql)
		if err != nil {
			return nil, nil, fmt.Errorf("-mysql: not a go-sql-driver DSN (user:pass@tcp(host:port)/db)")
		}
		return openMySQL(cfg, c)
	}
	if strings.HasPrefix(c.dsn, "mysql://") {
		// The same URL examples/payments takes, so one DATABASE_URL serves both.
		cfg, err := mysqlstore.ParseURL(c.dsn)
		if err != nil {
			return nil, nil, fmt.Errorf("-dsn: %w", err) // ParseURL never repeats the password
		}
		return openMySQL(cfg, c)
	}
	cfg, err := pgxpool.ParseConfig(c.dsn)
	if err != nil {
		// pgx's parse errors may quote the DSN, password included: say less.
		return nil, nil, fmt.Errorf("-dsn: not a PostgreSQL URL or key=value DSN")
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	opts := []pgstore.Option{pgstore.WithSchema(c.schema), pgstore.WithTable(c.table)}
	opts = append(opts, pgstore.WithRetentionMargin(c.margin)) // sweep and maintain only; 0 elsewhere
	partitioned, err := pgstore.MigratedMode(ctx, pool, opts...)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	if partitioned {
		// Days ahead only matters to Maintain; 2 is what Migrate made at
		// least (the README's recommendation); more were made if asked.
		opts = append(opts, pgstore.WithPartitioning(2))
	}
	st, err := pgstore.New(pool, opts...)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return st, func() { st.Close(); pool.Close() }, nil
}

// openMySQL opens mysqlstore on a driver configuration. No statement is
// sent until a command runs.
func openMySQL(cfg *mysql.Config, c common) (storekit.Admin, func(), error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: %w", err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(2)
	st, err := mysqlstore.New(db, mysqlstore.WithTable(c.table), mysqlstore.WithRetentionMargin(c.margin))
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return st, func() { _ = db.Close() }, nil
}

// openSQLite opens sqlitestore on an existing file (OpenDB would create a
// missing one: a typo must not look like an empty store).
func openSQLite(ctx context.Context, c common) (storekit.Admin, func(), error) {
	if _, err := os.Stat(c.sqlite); err != nil {
		return nil, nil, fmt.Errorf("-sqlite: %w", err)
	}
	db, err := sqlitestore.OpenDB(ctx, c.sqlite)
	if err != nil {
		return nil, nil, err
	}
	st, err := sqlitestore.New(db, sqlitestore.WithTable(c.table), sqlitestore.WithRetentionMargin(c.margin))
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return st, func() { st.Close(); _ = db.Close() }, nil
}
