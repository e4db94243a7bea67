package mystores_test

import (
	"testing"

	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/tests/internal/mystores"
)

// TestTxHandlerEnds: handlers that roll back or commit the lease
// transaction themselves (see tests/internal/mystores.TxHandlerEnds), on
// two stores (two pools, as two instances) sharing one database.
func TestTxHandlerEnds(t *testing.T) {
	s := mystores.Store(t)
	other, err := mysqlstore.New(s.DB())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	mystores.TxHandlerEnds(t, s.DB(), []*mysqlstore.Store{s, other})
}
