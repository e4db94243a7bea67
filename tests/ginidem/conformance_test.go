package ginidem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/ginidem/ginidemtest"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// TestConformancePostgres runs the suite, with the adapter of ginidemtest, on
// pgstore in a schema of its own; scenarios use unique keys and tenants, so
// they share one store.
func TestConformancePostgres(t *testing.T) {
	store, _ := pgstores.Store(t)
	idemtest.Run(t, ginidemtest.Adapter, func(*testing.T) core.Store { return store })
}
