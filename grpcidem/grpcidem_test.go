package grpcidem_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/grpcidem/grpcidemtest"
)

func TestConformanceMemstore(t *testing.T) {
	grpcidemtest.Run(t, func(testing.TB) core.Store { return memstore.New() })
}
