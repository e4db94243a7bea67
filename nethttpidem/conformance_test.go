package nethttpidem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem/nethttpidemtest"
)

func newMemstore(*testing.T) core.Store { return memstore.New() }

// TestConformance runs the idemtest suite on memstore, with the adapter of
// nethttpidemtest. The suite on the database stores runs in
// tests/nethttpidem, beside their drivers, with the same adapter.
func TestConformance(t *testing.T) {
	idemtest.Run(t, nethttpidemtest.Adapter, newMemstore)
}
