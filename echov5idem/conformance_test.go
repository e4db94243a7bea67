package echov5idem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echov5idem/echov5idemtest"
)

// TestConformance runs core/idemtest, the suite every adapter passes, on
// memstore, with the adapter of echov5idemtest; tests/echov5idem runs it on the
// database stores with the same adapter.
func TestConformance(t *testing.T) {
	idemtest.Run(t, echov5idemtest.Adapter, func(*testing.T) core.Store { return memstore.New() })
}
