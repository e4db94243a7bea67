package fiberidem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberidem/fiberidemtest"
)

// TestConformance runs the suite on memstore, with the adapter of
// fiberidemtest; tests/fiberidem runs it on the database stores with the
// same adapter.
func TestConformance(t *testing.T) {
	idemtest.Run(t, fiberidemtest.Adapter, func(*testing.T) core.Store { return memstore.New() })
}
