package fiberv3idem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberv3idem/fiberv3idemtest"
)

// TestConformance runs the suite on memstore, with the adapter of
// fiberv3idemtest; tests/fiberv3idem runs it on the database stores with
// the same adapter.
func TestConformance(t *testing.T) {
	idemtest.Run(t, fiberv3idemtest.Adapter, func(*testing.T) core.Store { return memstore.New() })
}
