package core_test

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/calltest"
	"github.com/idemkit/idem/core/memstore"
)

func TestCallMemstore(t *testing.T) {
	calltest.Run(t, func(testing.TB) core.Store { return memstore.New() })
}
