package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/mysqlstore"
)

// MySQL/MariaDB behind the servers (-dsn mysql://user:pass@host:port/db):
// examples/payments runs mysqlstore in transactional mode, the baseline
// and the article's design write with database/sql. Each server gets a
// fresh database (MySQL's schema level), dropped at the end. Pools:
// pool_max_conns in the URL, which examples/payments reads too.

func isMySQL(dsn string) bool { return strings.HasPrefix(dsn, "mysql://") }

// mysqlWithParams points a mysql:// URL at database db and sets the pool
// size (pool_max_conns, which examples/payments reads and strips).
func mysqlWithParams(dsn, db string, pool int) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("-dsn: not a mysql:// URL")
	}
	u.Path = "/" + db
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(pool))
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// openMySQL connects to the server a mysql:// URL names (pool_max_conns
// stripped: the driver would send it as a session variable).
func openMySQL(dsn string) (*sql.DB, int, error) {
	cfg, err := mysqlstore.ParseURL(dsn)
	if err != nil {
		return nil, 0, err
	}
	pool := 16
	if v, ok := cfg.Params["pool_max_conns"]; ok {
		delete(cfg.Params, "pool_max_conns")
		if pool, err = strconv.Atoi(v); err != nil || pool < 1 {
			return nil, 0, fmt.Errorf("-dsn: pool_max_conns=%q: want a positive integer", v)
		}
	}
	cfg.ParseTime = true // the article's design reads locked_until as a time
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, 0, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(pool)
	db.SetMaxIdleConns(pool)
	return db, pool, nil
}

// newMySQLDatabase creates a fresh database and returns it with a function
// dropping it.
func newMySQLDatabase(ctx context.Context, dsn string) (string, func(), error) {
	db, _, err := openMySQL(dsn)
	if err != nil {
		return "", nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "loadgen_" + hex.EncodeToString(b[:])
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		_ = db.Close()
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(dctx, "DROP DATABASE `"+name+"`"); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: drop database:", err)
		}
		_ = db.Close()
	}
	return name, drop, nil
}

// mysqlLedger opens the URL's database, creates the ledger table (the same
// columns as PostgreSQL's; and the article's for kind "article"), and
// returns its insert and the database.
func mysqlLedger(ctx context.Context, dsn, kind string) (func(ctx context.Context, args ...any) error, *sql.DB, func(), error) {
	db, _, err := openMySQL(dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	ddl := []string{`CREATE TABLE IF NOT EXISTS payments (
	id                 VARCHAR(64)  NOT NULL PRIMARY KEY,
	user_id            VARCHAR(255) NOT NULL,
	amount             BIGINT       NOT NULL CHECK (amount > 0),
	currency           VARCHAR(3)   NOT NULL,
	recipient          VARCHAR(255) NOT NULL,
	provider_charge_id VARCHAR(64)  NOT NULL,
	created_at         DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	KEY payments_user_idx (user_id, created_at, id)
) ENGINE = InnoDB`}
	if kind == "article" {
		ddl = append(ddl, articleDDL("idempotency_keys", articleMySQL)...)
	}
	for _, q := range ddl {
		if _, err := db.ExecContext(ctx, q); err != nil {
			_ = db.Close()
			return nil, nil, nil, err
		}
	}
	ins, err := db.PrepareContext(ctx, `INSERT INTO payments (id, user_id, amount, currency, recipient, provider_charge_id) VALUES (?, ?, ?, ?, ?, ?)`)
	if err != nil {
		_ = db.Close()
		return nil, nil, nil, err
	}
	insert := func(ctx context.Context, args ...any) error {
		_, err := ins.ExecContext(ctx, args...)
		return err
	}
	return insert, db, func() { _ = ins.Close(); _ = db.Close() }, nil
}
