package galera

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/tests/internal/mystores"
)

// TestTxHandlerEnds: mysqlstore.Tx with handlers that roll back or commit
// the lease transaction themselves, each attempt of a key on another node
// (see mystores.TxHandlerEnds): a response is recorded only if its
// writes committed, and committed writes never run again. The handler's
// own COMMIT lands through one node and the commit mark is read there,
// the replay through the next; then again with each store's transactions
// on another node than its own statements.
func TestTxHandlerEnds(t *testing.T) {
	c := newCluster(t)
	// The ledger table exists on every node before the first handler runs
	// (DDL replicates in total order, but another node may apply it a
	// moment after the first returns).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.db[0].ExecContext(ctx, mystores.LedgerTableSQL); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	for i, db := range c.db {
		var n int
		if err := db.QueryRowContext(ctx, "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*) FROM tx_ledger").Scan(&n); err != nil {
			t.Fatalf("node %d: ledger table: %v", i+1, err)
		}
	}
	t.Run("same-node", func(t *testing.T) {
		s := c.stores(t)
		mystores.TxHandlerEnds(t, c.db[0], []*mysqlstore.Store{s[0], s[1], s[2]})
	})
	// Each store's transactions on the next node (WithTxPool): the
	// handler's own COMMIT lands through one node, its commit mark is read
	// through another (causally).
	t.Run("tx-on-next-node", func(t *testing.T) {
		var s []*mysqlstore.Store
		for i := range c.db {
			st, err := mysqlstore.New(c.db[i], mysqlstore.WithTxPool(c.db[(i+1)%3]))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(st.Close)
			s = append(s, st)
		}
		mystores.TxHandlerEnds(t, c.db[0], s)
	})
}
