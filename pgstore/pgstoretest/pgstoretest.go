// Package pgstoretest is test support for code that runs against PostgreSQL:
// pgstore's own tests, idem's other tests, and your handlers' tests (pgstore
// on a schema of their own). It connects to the
// database named by IDEM_TEST_PG_DSN (default DefaultDSN) and gives each
// test a fresh schema, so test packages can run in parallel on one
// database.
//
// An unreachable database fails the test (it never skips): a suite that
// silently skips its database tests proves nothing.
package pgstoretest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultDSN is used when IDEM_TEST_PG_DSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// EnvDSN names the environment variable holding the test database DSN.
const EnvDSN = "IDEM_TEST_PG_DSN"

// DefaultMaxConns is the pool size Pool uses unless the DSN sets
// pool_max_conns: small, so that many test packages running in parallel
// stay within the server's max_connections.
const DefaultMaxConns = 8

const connectTimeout = 10 * time.Second

// DSN returns the test database DSN.
func DSN() string {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return dsn
	}
	return DefaultDSN
}

// Config returns a pool configuration for the test database (MaxConns
// DefaultMaxConns unless the DSN says otherwise). It fails tb if the DSN
// cannot be parsed.
func Config(tb testing.TB) *pgxpool.Config {
	tb.Helper()
	dsn := DSN()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatalf("pgstoretest: parse %s=%q: %v", EnvDSN, dsn, err)
	}
	if _, set := cfg.ConnConfig.RuntimeParams["pool_max_conns"]; !set {
		cfg.MaxConns = DefaultMaxConns
	}
	return cfg
}

// Pool connects to the test database with the default configuration. See
// NewPool.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return NewPool(tb, Config(tb))
}

// NewPool connects with cfg (from Config, possibly adjusted: MaxConns, a
// tracer), pings the server, and closes the pool when the test ends. If the
// database is unreachable it fails the test with a message saying how to
// point the tests at one.
func NewPool(tb testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgstoretest: connect to PostgreSQL (%s=%q): %v", EnvDSN, DSN(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		tb.Fatalf("pgstoretest: PostgreSQL unreachable (%s=%q): %v\n"+
			"these tests need a running PostgreSQL; set %s to its DSN", EnvDSN, DSN(), err, EnvDSN)
	}
	tb.Cleanup(func() { closePool(tb, pool) })
	return pool
}

// closeWait bounds how long closing a pool may take at cleanup.
const closeWait = 15 * time.Second

// closePool closes pool, which waits for every acquired connection to be
// released. A test that failed while holding one (typically a transaction
// it never ended) would otherwise hang until the test binary's timeout; this
// reports it instead and leaves the close to finish in the background.
func closePool(tb testing.TB, pool *pgxpool.Pool) {
	done := make(chan struct{})
	go func() {
		pool.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
		tb.Errorf("pgstoretest: closing the pool is blocked: %d connection(s) still acquired "+
			"(a transaction or connection the test never released?)", pool.Stat().AcquiredConns())
	}
}

// Schema creates a schema with a fresh random name ("idemtest_" + 16 hex
// digits) and drops it, with everything in it, when the test ends. Pass the
// name to the code under test (pgstore.WithSchema) to isolate the test.
func Schema(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("pgstoretest: random schema name: %v", err)
	}
	name := "idemtest_" + hex.EncodeToString(b[:])
	quoted := pgx.Identifier{name}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
		tb.Fatalf("pgstoretest: create schema %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+quoted+" CASCADE"); err != nil {
			tb.Errorf("pgstoretest: drop schema %s: %v", name, err)
		}
	})
	return name
}
