package fiberv3idem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/fiberv3idem/fiberv3idemtest"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// TestConformancePostgres runs the suite, with the adapter of
// fiberv3idemtest, on pgstore in a schema of its own; scenarios use unique
// keys and tenants, so they share one store.
func TestConformancePostgres(t *testing.T) {
	store, _ := pgstores.Store(t)
	idemtest.Run(t, fiberv3idemtest.Adapter, func(*testing.T) core.Store { return store })
}
