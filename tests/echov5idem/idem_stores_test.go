package echov5idem_test

// The adapter on the SQL stores, here in the tests module: an adapter's
// module does not depend on pgstore, mysqlstore or their drivers.

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/echov5idem/echov5idemtest"
	"github.com/idemkit/idem/tests/internal/mystores"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// TestConformancePostgres runs the suite on pgstore in a schema of its own;
// scenarios use unique keys and tenants, so they share one store.
func TestConformancePostgres(t *testing.T) {
	store, _ := pgstores.Store(t)
	idemtest.Run(t, echov5idemtest.Adapter, func(*testing.T) core.Store { return store })
}

// TestConformanceMySQL runs the suite on mysqlstore (MariaDB) in a database
// of its own; scenarios use unique keys and tenants, so they share one
// store.
func TestConformanceMySQL(t *testing.T) {
	store := mystores.Store(t)
	idemtest.Run(t, echov5idemtest.Adapter, func(*testing.T) core.Store { return store })
}
