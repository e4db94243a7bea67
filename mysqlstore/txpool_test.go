package mysqlstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestTxPoolCompletes: with WithTxPool, the lease transaction runs on
// another *sql.DB than the store's statements. Complete must run its
// fenced update in that transaction whatever the store prepared on its own
// pool before (database/sql refuses a statement prepared on one *sql.DB in
// a transaction of another), or every transactional request answers 500
// once a plain one has completed.
func TestTxPoolCompletes(t *testing.T) {
	cfg := mysqlstoretest.Database(t, "")
	db := mysqlstoretest.Open(t, cfg)
	s := openStore(t, db, WithTxPool(mysqlstoretest.Open(t, cfg)))
	ledgerTable(t, db)
	for _, key := range []string{"a", "b", "c"} {
		// A plain execution first: the store prepares its statements on
		// its own pool.
		plain := claimReq("plain-"+key, time.Minute)
		res, err := s.Claim(t.Context(), plain)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(t.Context(), storekit.Fence{Scope: plain.Scope, Key: plain.Key, Token: res.Record.Token},
			storekit.StoredResponse{Status: 201}); err != nil {
			t.Fatal(err)
		}
		hctx, f := handlerCtx(t, s, claimReq(key, time.Minute))
		if err := book(hctx, key, f.Token); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
			t.Fatalf("%s: complete in the lease transaction: %v", key, err)
		}
		if n := ledgerRows(t, db, key); n != 1 {
			t.Errorf("%s: %d ledger rows, want 1", key, n)
		}
	}
}
