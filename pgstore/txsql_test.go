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

// TestTxEndedBySQL: a handler that ends the lease's transaction with SQL
// (tx.Exec(ctx, "ROLLBACK"), "ABORT", "COMMIT") instead of leaving it to
// idem. pgx does not see it: the next statements on the connection would
// run in autocommit. After a ROLLBACK its writes did not land, so the
// response must not be recorded (the key is released and Complete reports
// storekit.ErrNotCommitted), and a later write through the transaction is
// refused rather than committed on its own. After a COMMIT the writes did
// land: the response is recorded.
func TestTxEndedBySQL(t *testing.T) {
	for _, m := range modes {
		for _, end := range []string{"ROLLBACK", "ABORT", "COMMIT", "END"} {
			t.Run(m.name+"/"+end, func(t *testing.T) {
				t.Parallel()
				s, table, req, ctx, f, tx := wroteLedgerRow(t, m.opts)
				if _, err := tx.Exec(ctx, end); err != nil {
					t.Fatalf("%s: %v", end, err)
				}
				committed := end == "COMMIT" || end == "END"
				// A write after the transaction ended must not commit on
				// its own.
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", req.Key, -1); err == nil {
					t.Errorf("a write after %s was accepted (it would autocommit)", end)
				}
				err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")})
				rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
				if gerr != nil {
					t.Fatalf("get: %v", gerr)
				}
				rows := ledgerRows(t, s, table, req.Key)
				if committed {
					if err != nil || rec.Status != storekit.StatusCompleted || len(rows) != 1 || rows[0] != f.Token {
						t.Errorf("after %s: Complete %v, record %s, ledger %v; want nil, completed, [%d]", end, err, rec.Status, rows, f.Token)
					}
				} else {
					if !errors.Is(err, storekit.ErrNotCommitted) {
						t.Errorf("Complete after %s = %v, want storekit.ErrNotCommitted", end, err)
					}
					if rec.Status == storekit.StatusCompleted || len(rows) != 0 {
						t.Errorf("after %s: record %s, ledger %v; want not completed (released), no rows", end, rec.Status, rows)
					}
				}
				if st := s.pool.Stat(); st.AcquiredConns() != 0 {
					t.Errorf("%d connections still acquired after Complete", st.AcquiredConns())
				}
			})
		}
	}
}

// TestTxEndedBySQLThenFail: a handler that committed its writes with SQL
// and then failed must not have them run again: the record is completed
// as not retained. One that rolled back with SQL and failed is released.
// A ROLLBACK TO SAVEPOINT (tag ROLLBACK, transaction still open) changes
// nothing: Complete commits the writes with the response.
func TestTxEndedBySQLThenFail(t *testing.T) {
	for _, m := range modes {
		for _, end := range []string{"COMMIT", "ROLLBACK"} {
			t.Run(m.name+"/"+end, func(t *testing.T) {
				t.Parallel()
				s, table, req, ctx, f, tx := wroteLedgerRow(t, m.opts)
				if _, err := tx.Exec(ctx, end); err != nil {
					t.Fatalf("%s: %v", end, err)
				}
				if err := s.Fail(ctx, f); err != nil {
					t.Fatalf("Fail after %s: %v", end, err)
				}
				rec, err := s.Get(t.Context(), req.Scope, req.Key)
				if err != nil {
					t.Fatalf("get: %v", err)
				}
				rows := ledgerRows(t, s, table, req.Key)
				if end == "COMMIT" {
					if rec.Status != storekit.StatusCompleted || rec.Response == nil || !rec.Response.NotRetained || len(rows) != 1 {
						t.Errorf("after COMMIT and Fail: record %s %+v, ledger %v; want completed as not retained, one row", rec.Status, rec.Response, rows)
					}
				} else if rec.Status != storekit.StatusFailed || len(rows) != 0 {
					t.Errorf("after ROLLBACK and Fail: record %s, ledger %v; want failed, no rows", rec.Status, rows)
				}
			})
		}
		t.Run(m.name+"/savepoint", func(t *testing.T) {
			t.Parallel()
			s, table, req, ctx, f, tx := wroteLedgerRow(t, m.opts)
			for _, q := range []string{"SAVEPOINT a", "INSERT INTO " + table + " (key, token) VALUES ('k', -1)", "ROLLBACK TO SAVEPOINT a"} {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if rows := ledgerRows(t, s, table, req.Key); len(rows) != 1 || rows[0] != f.Token {
				t.Errorf("ledger %v, want [%d]", rows, f.Token)
			}
		})
	}
}

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

// TestTxCommittedBySQLThenCompleteFails: a handler that committed its
// writes with SQL (COMMIT, or COMMIT AND CHAIN: the transaction goes on),
// whose response then cannot be recorded (a deferred statement the
// database refuses), or that then fails. The writes have landed: the key
// must not be released, or a retry runs them again. The record is
// completed as not retained, as after Fail.
func TestTxCommittedBySQLThenCompleteFails(t *testing.T) {
	for _, m := range modes {
		for _, end := range []string{"COMMIT", "COMMIT AND CHAIN"} {
			for _, then := range []string{"complete", "fail"} {
				t.Run(m.name+"/"+end+"/"+then, func(t *testing.T) {
					t.Parallel()
					s, table, req, ctx, f, tx := wroteLedgerRow(t, m.opts)
					if _, err := tx.Exec(ctx, end); err != nil {
						t.Fatalf("%s: %v", end, err)
					}
					var err error
					if then == "complete" {
						if err := Defer(ctx, "SELECT 1/0"); err != nil {
							t.Fatalf("Defer: %v", err)
						}
						err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")})
						if err == nil {
							t.Fatal("Complete succeeded although a deferred statement failed")
						}
						if errors.Is(err, storekit.ErrNotCommitted) {
							t.Errorf("Complete = %v: reports the writes not committed, but the handler's %s landed", err, end)
						}
					} else if err = s.Fail(ctx, f); err != nil {
						t.Fatalf("Fail: %v", err)
					}
					rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
					if gerr != nil {
						t.Fatalf("get: %v", gerr)
					}
					if rows := ledgerRows(t, s, table, req.Key); len(rows) != 1 {
						t.Fatalf("ledger %v, want the one row the handler committed", rows)
					}
					if rec.Status != storekit.StatusCompleted || rec.Response == nil || !rec.Response.NotRetained {
						t.Errorf("record %s %+v after %s = %v: the committed writes' key was left claimable (a retry runs them again); want completed as not retained", rec.Status, rec.Response, then, err)
					}
					if res, err := s.Claim(t.Context(), req); err != nil || res.Claimed {
						t.Errorf("retry: claimed %v (%v); want the completed record", res.Claimed, err)
					}
					if st := s.pool.Stat(); st.AcquiredConns() != 0 {
						t.Errorf("%d connections still acquired", st.AcquiredConns())
					}
				})
			}
		}
	}
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
