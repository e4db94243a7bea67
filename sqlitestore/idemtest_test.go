package sqlitestore_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/nethttpidem/nethttpidemtest"
	"github.com/idemkit/idem/sqlitestore/sqlitestoretest"
)

// TestIdemtestNetHTTP runs the adapter suite, with the adapter of
// nethttpidemtest (the other adapters' runs on sqlitestore belong with
// them), on sqlitestore; scenarios use unique keys and tenants, so they
// share one store.
func TestIdemtestNetHTTP(t *testing.T) {
	store := sqlitestoretest.Store(t)
	idemtest.Run(t, nethttpidemtest.Adapter, func(*testing.T) core.Store { return store })
}
