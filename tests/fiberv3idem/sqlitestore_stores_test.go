package fiberv3idem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/fiberv3idem/fiberv3idemtest"
	"github.com/idemkit/idem/sqlitestore/sqlitestoretest"
)

// TestConformanceSQLite runs the suite on sqlitestore, on a file of its
// own. Scenarios use unique keys and tenants, so they share one store.
func TestConformanceSQLite(t *testing.T) {
	store := sqlitestoretest.Store(t)
	idemtest.Run(t, fiberv3idemtest.Adapter, func(*testing.T) core.Store { return store })
}
