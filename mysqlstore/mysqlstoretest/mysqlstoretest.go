// Package mysqlstoretest is test support for code that runs against MySQL or
// MariaDB: mysqlstore's own tests, idem's other tests (Galera included), and
// your handlers' tests (mysqlstore on a database of its own). It connects to the server named by IDEM_TEST_MYSQL_DSN
// (default DefaultDSN, go-sql-driver DSN syntax) and gives each test a fresh
// database, dropped when the test ends, so test packages can run in
// parallel on one server.
//
// An unreachable server fails the test (it never skips): a suite that
// silently skips its database tests proves nothing.
package mysqlstoretest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultDSN is used when IDEM_TEST_MYSQL_DSN is unset.
const DefaultDSN = "root@tcp(127.0.0.1:3306)/test"

// EnvDSN names the environment variable holding the test server's DSN.
const EnvDSN = "IDEM_TEST_MYSQL_DSN"

// DefaultMaxConns is the pool size Open sets: small, so that many test
// packages running in parallel stay within the server's max_connections
// (151 by default).
const DefaultMaxConns = 8

const connectTimeout = 10 * time.Second

// DSN returns the test server DSN.
func DSN() string {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return dsn
	}
	return DefaultDSN
}

// Config parses dsn (DSN() when empty) and fails tb if it cannot.
func Config(tb testing.TB, dsn string) *mysql.Config {
	tb.Helper()
	if dsn == "" {
		dsn = DSN()
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("mysqlstoretest: parse DSN %q: %v", dsn, err)
	}
	return cfg
}

// Open connects with cfg (MaxOpenConns and MaxIdleConns DefaultMaxConns), pings the server,
// and closes the pool when the test ends. If the server is unreachable it
// fails the test with a message saying how to point the tests at one.
func Open(tb testing.TB, cfg *mysql.Config) *sql.DB {
	tb.Helper()
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatalf("mysqlstoretest: connector for %s: %v", cfg.Addr, err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(DefaultMaxConns)
	// Keep connections (database/sql keeps 2 idle by default): statements
	// prepared on a connection die with it, and tests should run the way a
	// sized production pool does.
	db.SetMaxIdleConns(DefaultMaxConns)
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		tb.Fatalf("mysqlstoretest: MySQL/MariaDB unreachable at %s (%s=%q): %v\n"+
			"these tests need a running MySQL 8+ or MariaDB 10.6+; set %s to its DSN", cfg.Addr, EnvDSN, os.Getenv(EnvDSN), err, EnvDSN)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// Database creates a database with a fresh random name ("idemtest_" + 16
// hex digits) on the server named by dsn (DSN() when empty), drops it with
// everything in it when the test ends, and returns the configuration of a
// connection to it (a copy of dsn's with DBName set). Open it with Open
// (or hand cfg.FormatDSN() to a program under test).
func Database(tb testing.TB, dsn string) *mysql.Config {
	tb.Helper()
	admin := Open(tb, Config(tb, dsn))
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("mysqlstoretest: random database name: %v", err)
	}
	name := "idemtest_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		tb.Fatalf("mysqlstoretest: create database %s: %v", name, err)
	}
	// Registered after admin's Close (Cleanup runs last-in first-out), so
	// admin is still open here.
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			tb.Errorf("mysqlstoretest: drop database %s: %v", name, err)
		}
	})
	cfg := Config(tb, dsn)
	cfg.DBName = name
	return cfg
}

// NewDB is Database followed by Open: a pool on a fresh database of the
// server named by dsn (DSN() when empty).
func NewDB(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	return Open(tb, Database(tb, dsn))
}
