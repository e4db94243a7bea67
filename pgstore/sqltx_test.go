package pgstore

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// sqlHandle is handle through database/sql: one ledger row in the lease's
// transaction, as SQLTx gives it.
func sqlHandle(ctx context.Context, table, key string) error {
	tx, err := SQLTx(ctx)
	if err != nil {
		return err
	}
	l, _ := storekit.LeaseFromContext(ctx)
	_, err = tx.ExecContext(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, l.Fence().Token)
	return err
}

// assertReleased checks that no pool connection is still held.
func assertReleased(t *testing.T, s *Store) {
	t.Helper()
	assert.Zero(t, s.pool.Stat().AcquiredConns(), "connections still acquired")
}

// TestSQLTxCommitIsAtomicWithRecord: the *sql.Tx SQLTx hands out is the
// lease transaction: the handler's writes are invisible until Complete,
// which commits them with the response. Commit and Rollback are refused
// (ErrTxOwned) and change nothing, but database/sql closes the *sql.Tx all
// the same: a later statement fails rather than running outside it. Tx
// after SQLTx is the same transaction.
func TestSQLTxCommitIsAtomicWithRecord(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, pgstoretest.Pool(t), m.opts...)
			table := ledger(t, s)
			req := claimReq("k1", time.Minute)
			ctx, f := mustClaim(t, s, req)

			tx1, err := SQLTx(ctx)
			require.NoError(t, err)
			tx2, err := SQLTx(ctx)
			require.NoError(t, err)
			require.Same(t, tx1, tx2, "SQLTx twice returned different transactions")
			require.NoError(t, sqlHandle(ctx, table, req.Key))

			// Tx after SQLTx: the same transaction, through pgx.
			ptx, err := Tx(ctx)
			require.NoError(t, err)
			var n int
			require.NoError(t, ptx.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
			assert.Equal(t, 1, n, "pgx's Tx does not see the row written through SQLTx")

			assert.Empty(t, ledgerRows(t, s, table, req.Key), "ledger visible before Complete")
			require.ErrorIs(t, tx1.Commit(), ErrTxOwned)
			require.ErrorIs(t, tx1.Rollback(), sql.ErrTxDone)
			_, err = tx1.ExecContext(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, -1)", req.Key)
			require.ErrorIs(t, err, sql.ErrTxDone, "a write after the handler's Commit")

			require.NoError(t, s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")}))
			assert.Equal(t, []int64{f.Token}, ledgerRows(t, s, table, req.Key))
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			require.NoError(t, err)
			assert.Equal(t, storekit.StatusCompleted, rec.Status)
			require.NotNil(t, rec.Response)
			assert.Equal(t, "ok", string(rec.Response.Body))
			_, err = SQLTx(ctx)
			assert.ErrorIs(t, err, ErrLeaseFinished)
			assertReleased(t, s)
		})
	}
}

// TestSQLTxRollbackRefused: the idiomatic `defer tx.Rollback()` changes
// nothing: the writes commit with the response.
func TestSQLTxRollbackRefused(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	req := claimReq("k1", time.Minute)
	ctx, f := mustClaim(t, s, req)
	require.NoError(t, sqlHandle(ctx, table, req.Key))
	tx, err := SQLTx(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, tx.Rollback(), ErrTxOwned)
	require.NoError(t, s.Complete(ctx, f, storekit.StoredResponse{Status: 201}))
	assert.Equal(t, []int64{f.Token}, ledgerRows(t, s, table, req.Key))
	assertReleased(t, s)
}

// TestSQLTxFailRollsBack: Fail rolls the handler's writes back and releases
// the key; the retry's writes land.
func TestSQLTxFailRollsBack(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	req := claimReq("k1", time.Minute)
	ctx, f := mustClaim(t, s, req)
	require.NoError(t, sqlHandle(ctx, table, req.Key))
	require.NoError(t, s.Fail(ctx, f))
	assert.Empty(t, ledgerRows(t, s, table, req.Key))
	rec, err := s.Get(t.Context(), req.Scope, req.Key)
	require.NoError(t, err)
	assert.Equal(t, storekit.StatusFailed, rec.Status)
	assertReleased(t, s)

	ctx2, f2 := mustClaim(t, s, req)
	require.NoError(t, sqlHandle(ctx2, table, req.Key))
	require.NoError(t, s.Complete(ctx2, f2, storekit.StoredResponse{Status: 201}))
	assert.Equal(t, []int64{f2.Token}, ledgerRows(t, s, table, req.Key))
}

// TestSQLTxOutlivesRequestContext: database/sql rolls a transaction back
// when the context it was begun with ends; the lease transaction lasts
// until Complete, whatever happens to the request.
func TestSQLTxOutlivesRequestContext(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	req := claimReq("k1", time.Minute)
	ctx, f := mustClaim(t, s, req)
	reqCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, sqlHandle(reqCtx, table, req.Key))
	cancel()
	time.Sleep(50 * time.Millisecond) // database/sql's watcher would have rolled back by now
	require.NoError(t, s.Complete(ctx, f, storekit.StoredResponse{Status: 201}))
	assert.Equal(t, []int64{f.Token}, ledgerRows(t, s, table, req.Key))
	assertReleased(t, s)
}

// TestSQLTxEndedBySQL: a handler that ends the transaction with SQL
// through database/sql (Exec, Query, a prepared statement) instead of
// leaving it to idem. Its later statements are refused (they would
// autocommit). After a ROLLBACK its writes did not land: Complete records
// nothing, releases the key and reports storekit.ErrNotCommitted. After a
// COMMIT they did: the response is recorded; a Fail completes the record
// as not retained.
func TestSQLTxEndedBySQL(t *testing.T) {
	ways := map[string]func(ctx context.Context, tx *sql.Tx, end string) error{
		"exec": func(ctx context.Context, tx *sql.Tx, end string) error {
			_, err := tx.ExecContext(ctx, end)
			return err
		},
		"query": func(ctx context.Context, tx *sql.Tx, end string) error {
			rows, err := tx.QueryContext(ctx, end)
			if err != nil {
				return err
			}
			return rows.Close()
		},
		"prepared": func(ctx context.Context, tx *sql.Tx, end string) error {
			st, err := tx.PrepareContext(ctx, end)
			if err != nil {
				return err
			}
			_, err = st.ExecContext(ctx)
			return err
		},
	}
	for way, endTx := range ways {
		for _, end := range []string{"ROLLBACK", "COMMIT", "COMMIT AND CHAIN"} {
			for _, then := range []string{"complete", "fail"} {
				if way == "query" && end == "COMMIT AND CHAIN" {
					continue // a tag idem does not read, the transaction goes on: unseen, as with Tx's Query
				}
				t.Run(way+"/"+end+"/"+then, func(t *testing.T) {
					t.Parallel()
					s := newStore(t, pgstoretest.Pool(t))
					table := ledger(t, s)
					req := claimReq("k", time.Minute)
					ctx, f := mustClaim(t, s, req)
					require.NoError(t, sqlHandle(ctx, table, req.Key))
					tx, err := SQLTx(ctx)
					require.NoError(t, err)
					require.NoError(t, endTx(ctx, tx, end))
					committed := end != "ROLLBACK"
					chained := end == "COMMIT AND CHAIN"
					_, err = tx.ExecContext(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, -1)", req.Key)
					if !chained {
						require.Error(t, err, "a write after %s was accepted (it would autocommit)", end)
					}
					if then == "complete" {
						err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")})
					} else {
						err = s.Fail(ctx, f)
					}
					rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
					require.NoError(t, gerr)
					rows := ledgerRows(t, s, table, req.Key)
					switch {
					case !committed:
						if then == "complete" {
							assert.ErrorIs(t, err, storekit.ErrNotCommitted)
						} else {
							assert.NoError(t, err)
						}
						assert.NotEqual(t, storekit.StatusCompleted, rec.Status, "the response was recorded for writes that did not land")
						assert.Empty(t, rows)
					case then == "complete":
						require.NoError(t, err)
						assert.Equal(t, storekit.StatusCompleted, rec.Status)
						assert.Contains(t, rows, f.Token)
					default: // committed, then failed: never run again
						require.NoError(t, err)
						assert.Equal(t, storekit.StatusCompleted, rec.Status)
						require.NotNil(t, rec.Response)
						assert.True(t, rec.Response.NotRetained, "the committed writes' key was left claimable")
						assert.Equal(t, []int64{f.Token}, rows)
					}
					assertReleased(t, s)
				})
			}
		}
	}
}

// TestSQLTxStaleOwnerWritesVanish: the owner's lease lapses, a retry takes
// the key over and commits; the stale owner's Complete fails with
// ErrLeaseLost and its writes through SQLTx are gone.
func TestSQLTxStaleOwnerWritesVanish(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	req := claimReq("k1", 200*time.Millisecond)
	staleCtx, staleFence := mustClaim(t, s, req)
	require.NoError(t, sqlHandle(staleCtx, table, req.Key))
	time.Sleep(300 * time.Millisecond)
	newCtx, newFence := mustClaim(t, s, req)
	require.NoError(t, sqlHandle(newCtx, table, req.Key))
	err := s.Complete(staleCtx, staleFence, storekit.StoredResponse{Status: 201, Body: []byte("stale")})
	require.ErrorIs(t, err, core.ErrLeaseLost)
	require.NoError(t, s.Complete(newCtx, newFence, storekit.StoredResponse{Status: 201, Body: []byte("new")}))
	assert.Equal(t, []int64{newFence.Token}, ledgerRows(t, s, table, req.Key))
	assertReleased(t, s)
}

// TestSQLTxAfterTx: SQLTx after a statement sent through Tx is refused (that
// transaction is on a pgx connection); before any, it takes the
// transaction over.
func TestSQLTxAfterTx(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)

	ctx, f := mustClaim(t, s, claimReq("begun", time.Minute))
	require.NoError(t, handle(ctx, table, "begun"))
	_, err := SQLTx(ctx)
	require.ErrorIs(t, err, errTxBegunByPgx)
	require.NoError(t, s.Complete(ctx, f, storekit.StoredResponse{Status: 201}))

	ctx, f = mustClaim(t, s, claimReq("fresh", time.Minute))
	_, err = Tx(ctx)
	require.NoError(t, err)
	require.NoError(t, sqlHandle(ctx, table, "fresh"))
	require.NoError(t, handle(ctx, table, "fresh"))
	require.NoError(t, s.Complete(ctx, f, storekit.StoredResponse{Status: 201}))
	assert.Equal(t, []int64{f.Token, f.Token}, ledgerRows(t, s, table, "fresh"))
	assertReleased(t, s)
}

// TestSQLTxLeakedRows: rows the handler left open do not keep the store
// from committing: ending database/sql's transaction closes them first.
func TestSQLTxLeakedRows(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	req := claimReq("k1", time.Minute)
	ctx, f := mustClaim(t, s, req)
	require.NoError(t, sqlHandle(ctx, table, req.Key))
	tx, err := SQLTx(ctx)
	require.NoError(t, err)
	rows, err := tx.QueryContext(ctx, "SELECT generate_series(1, 10000)")
	require.NoError(t, err)
	require.True(t, rows.Next())
	require.NoError(t, s.Complete(ctx, f, storekit.StoredResponse{Status: 201}))
	assert.Equal(t, []int64{f.Token}, ledgerRows(t, s, table, req.Key))
	assertReleased(t, s)
}

// TestSQLTxIdleTimeout: WithTxIdleTimeout applies to SQLTx's transaction.
func TestSQLTxIdleTimeout(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t), WithTxIdleTimeout(1500*time.Millisecond))
	req := claimReq("k1", time.Minute)
	ctx, f := mustClaim(t, s, req)
	tx, err := SQLTx(ctx)
	require.NoError(t, err)
	var v string
	require.NoError(t, tx.QueryRowContext(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&v))
	assert.Equal(t, "1500ms", v)
	require.NoError(t, s.Fail(ctx, f))
}
