package fiberv3idem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/fiberv3idem/fiberv3idemtest"
	"github.com/idemkit/idem/tests/internal/mystores"
)

// TestConformanceMySQL runs the suite on mysqlstore, in a database of its
// own (IDEM_TEST_MYSQL_DSN). Scenarios use unique keys and tenants, so they
// share one store.
func TestConformanceMySQL(t *testing.T) {
	store := mystores.Store(t)
	idemtest.Run(t, fiberv3idemtest.Adapter, func(*testing.T) core.Store { return store })
}
