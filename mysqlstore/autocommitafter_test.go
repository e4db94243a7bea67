package mysqlstore

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestTxWritesAfterServerRollback: the server rolls the handler's Tx
// transaction back behind database/sql's back (here ROLLBACK sent as SQL;
// a deadlock the handler ignores does the same), and the handler goes on
// writing on it: those writes autocommit, one by one. Its ledger row is
// then committed, and the key must never be released, or a retry books it
// again.
func TestTxWritesAfterServerRollback(t *testing.T) {
	for _, end := range []string{"complete", "fail"} {
		t.Run(end, func(t *testing.T) {
			db := mysqlstoretest.NewDB(t, "")
			s := openStore(t, db)
			ledgerTable(t, db)
			req := claimReq("k", time.Minute)
			hctx, f := handlerCtx(t, s, req)
			tx, err := Tx(hctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(hctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			if err := book(hctx, req.Key, f.Token); err != nil {
				t.Fatal(err)
			}
			if end == "complete" {
				err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
			} else {
				err = s.Fail(hctx, f)
			}
			if end == "complete" && !errors.Is(err, ErrTxRolledByServer) || end == "fail" && err != nil {
				t.Errorf("%s = %v, want ErrTxRolledByServer from Complete, nil from Fail", end, err)
			}
			rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
			if gerr != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || !rec.Response.NotRetained {
				t.Errorf("record %s %+v %v, want completed as not retained", rec.Status, rec.Response, gerr)
			}
			if n := ledgerRows(t, db, req.Key); n != 1 {
				t.Fatalf("%d ledger rows, want 1 (autocommitted)", n)
			}
			assertNeverReleased(t, s, req)
		})
	}
}
