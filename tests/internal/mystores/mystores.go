// Package mystores gives tests outside mysqlstore a migrated store on
// a fresh database of the MySQL/MariaDB test server (mysqlstore/mysqlstoretest:
// IDEM_TEST_MYSQL_DSN). It is separate from mysqlstoretest because mysqlstore's own
// tests import mysqlstoretest, which therefore cannot import mysqlstore.
package mystores

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// Store migrates a fresh database (dropped when t ends, see
// mysqlstoretest.Database) and returns a mysqlstore on it. An unreachable server or
// a failed migration fails t.
func Store(t testing.TB, opts ...mysqlstore.Option) *mysqlstore.Store {
	t.Helper()
	db := mysqlstoretest.NewDB(t, "")
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
