package echoidem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echoidem/echoidemtest"
)

// TestConformance runs core/idemtest, the suite every adapter passes, on
// memstore, with the adapter of echoidemtest; tests/echoidem runs it on the
// database stores with the same adapter.
func TestConformance(t *testing.T) {
	idemtest.Run(t, echoidemtest.Adapter, func(*testing.T) core.Store { return memstore.New() })
}
