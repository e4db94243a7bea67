// Package mysqlstoretest gives tests outside mysqlstore a migrated store on
// a fresh database of the MySQL/MariaDB test server (internal/mytest:
// IDEM_TEST_MYSQL_DSN). It is separate from mytest because mysqlstore's own
// tests import mytest, which therefore cannot import mysqlstore.
package mysqlstoretest

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/mytest"
	"github.com/idemkit/idem/mysqlstore"
)

// Store migrates a fresh database (dropped when t ends, see
// mytest.Database) and returns a mysqlstore on it. An unreachable server or
// a failed migration fails t.
func Store(t testing.TB, opts ...mysqlstore.Option) *mysqlstore.Store {
	t.Helper()
	db := mytest.NewDB(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := mysqlstore.Migrate(ctx, db, opts...); err != nil {
		t.Fatalf("mysqlstore.Migrate: %v", err)
	}
	store, err := mysqlstore.New(db, opts...)
	if err != nil {
		t.Fatalf("mysqlstore.New: %v", err)
	}
	t.Cleanup(store.Close) // its statements (registered after the pool's Close: runs first)
	return store
}
