package mysqlstore_test

import (
	"testing"

	"github.com/idemkit/idem/internal/mysqlstoretest"
	"github.com/idemkit/idem/mysqlstore"
)

// TestTxHandlerEnds: handlers that roll back or commit the lease
// transaction themselves (see internal/mysqlstoretest.TxHandlerEnds), on
// two stores (two pools, as two instances) sharing one database.
func TestTxHandlerEnds(t *testing.T) {
	s := mysqlstoretest.Store(t)
	other, err := mysqlstore.New(s.DB())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	mysqlstoretest.TxHandlerEnds(t, s.DB(), []*mysqlstore.Store{s, other})
}
