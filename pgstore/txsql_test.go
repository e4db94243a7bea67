package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// wroteLedgerRow claims a key on a fresh store and writes one ledger row in
// the lease's transaction, as a handler does.
func wroteLedgerRow(t *testing.T, opts []Option) (*Store, string, storekit.ClaimRequest, context.Context, storekit.Fence, pgx.Tx) {
	t.Helper()
	s := newStore(t, pgstoretest.Pool(t), opts...)
	table := ledger(t, s)
	req := claimReq("k", time.Minute)
	ctx, f := mustClaim(t, s, req)
	if err := handle(ctx, table, req.Key); err != nil {
		t.Fatalf("handler: %v", err)
	}
	tx, err := Tx(ctx)
	if err != nil {
		t.Fatalf("Tx: %v", err)
	}
	return s, table, req, ctx, f, tx
}

// TestTxEndedUnseen: a handler that ends the lease's transaction through a
// call whose command tag idem does not read (Query, SendBatch, a
// multi-statement Exec whose last statement is not the end, the
// connection from Conn). Whether its writes landed is then asked of
// PostgreSQL. After a COMMIT they did: the key must not be released, or a
// retry runs them again (Complete records the response, Fail completes the
// record as not retained). After a ROLLBACK they did not: Complete
// releases the key and reports storekit.ErrNotCommitted, Fail marks the
// record failed.
func TestTxEndedUnseen(t *testing.T) {
	ways := map[string]func(ctx context.Context, tx pgx.Tx, end string) error{
		"query": func(ctx context.Context, tx pgx.Tx, end string) error {
			rows, err := tx.Query(ctx, end)
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"batch": func(ctx context.Context, tx pgx.Tx, end string) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			b.Queue(end)
			return tx.SendBatch(ctx, b).Close()
		},
		"multi": func(ctx context.Context, tx pgx.Tx, end string) error {
			_, err := tx.Exec(ctx, end+"; SELECT 1")
			return err
		},
		"conn": func(ctx context.Context, tx pgx.Tx, end string) error {
			_, err := tx.Conn().Exec(ctx, end)
			return err
		},
	}
	for _, m := range modes {
		for way, endTx := range ways {
			for _, end := range []string{"COMMIT", "ROLLBACK"} {
				for _, then := range []string{"complete", "fail"} {
					t.Run(m.name+"/"+way+"/"+end+"/"+then, func(t *testing.T) {
						t.Parallel()
						s, table, req, ctx, f, tx := wroteLedgerRow(t, m.opts)
						if err := endTx(ctx, tx, end); err != nil {
							t.Fatalf("%s through %s: %v", end, way, err)
						}
						var err error
						if then == "complete" {
							err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")})
						} else {
							err = s.Fail(ctx, f)
						}
						rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
						if gerr != nil {
							t.Fatalf("get: %v", gerr)
						}
						rows := ledgerRows(t, s, table, req.Key)
						switch {
						case end == "COMMIT" && then == "complete":
							if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || rec.Response.Status != 201 || len(rows) != 1 {
								t.Errorf("Complete %v, record %s %+v, ledger %v; want nil, completed with the response, one row", err, rec.Status, rec.Response, rows)
							}
						case end == "COMMIT":
							if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || !rec.Response.NotRetained || len(rows) != 1 {
								t.Errorf("Fail %v, record %s %+v, ledger %v; want nil, completed as not retained, one row", err, rec.Status, rec.Response, rows)
							}
						case then == "complete":
							if !errors.Is(err, storekit.ErrNotCommitted) || rec.Status == storekit.StatusCompleted || len(rows) != 0 {
								t.Errorf("Complete %v, record %s, ledger %v; want storekit.ErrNotCommitted, released, no rows", err, rec.Status, rows)
							}
						default:
							if err != nil || rec.Status != storekit.StatusFailed || len(rows) != 0 {
								t.Errorf("Fail %v, record %s, ledger %v; want nil, failed, no rows", err, rec.Status, rows)
							}
						}
						if end == "COMMIT" {
							if res, err := s.Claim(t.Context(), req); err != nil || res.Claimed {
								t.Errorf("retry after the handler's %s: claimed %v (%v); its writes would run again", end, res.Claimed, err)
							}
						}
						if st := s.pool.Stat(); st.AcquiredConns() != 0 {
							t.Errorf("%d connections still acquired", st.AcquiredConns())
						}
					})
				}
			}
		}
	}
}
