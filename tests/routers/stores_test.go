package routers

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/tests/internal/mystores"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// postgresStore is pgstore in a fresh schema (fails, never skips, when
// PostgreSQL is unreachable).
func postgresStore(t *testing.T) core.Store {
	store, _ := pgstores.Store(t)
	return store
}

// mysqlStore is mysqlstore in a fresh database (fails, never skips, when
// MariaDB is unreachable).
func mysqlStore(t *testing.T) core.Store {
	return mystores.Store(t)
}
