package pgstore

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storetest/txtest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestTxContract runs the transactional stores' contract in each retention
// mode and in transactional mode. pgstore refuses the handler's Commit and
// Rollback, and any statement after the handler ended the transaction with
// SQL; it runs the deferred statements ahead of the fenced complete; it has
// no commit marks (txid_status tells Complete how a transaction
// it did not end ended: TestTxEndedUnseen).
//
// The same contract holds for SQLTx, the lease transaction as a *sql.Tx
// (group "SQLTx"), but for the statements it costs: it begins at once.
func TestTxContract(t *testing.T) {
	for _, m := range deferModes() {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			txtest.Run(t, txHarness(m.opts, pgxTx))
		})
	}
	for _, m := range []string{"plain", "transactional"} {
		t.Run("SQLTx/"+m, func(t *testing.T) {
			t.Parallel()
			var opts []Option
			if m == "transactional" {
				opts = []Option{WithTransactional()}
			}
			h := txHarness(opts, func(ctx context.Context) (txtest.Tx, error) {
				tx, err := SQLTx(ctx)
				if err != nil {
					return nil, err
				}
				return txtest.SQLTx(tx), nil
			})
			maps.Copy(h.Counts, map[string]int{
				"first Tx": 1, "Tx": 1, // BEGIN, at once
				"insert in tx": 1,
			})
			txtest.Run(t, h)
		})
	}
}

func pgxTx(ctx context.Context) (txtest.Tx, error) {
	tx, err := Tx(ctx)
	if err != nil {
		return nil, err
	}
	return pgTx{tx}, nil
}

func txHarness(opts []Option, tx func(context.Context) (txtest.Tx, error)) txtest.Harness {
	return txtest.Harness{
		New:                func(t *testing.T) *txtest.Env { return txEnv(t, newStore(t, pgstoretest.Pool(t), opts...)) },
		Tx:                 tx,
		Defer:              Defer,
		ErrNoLease:         ErrNoLease,
		ErrLeaseFinished:   ErrLeaseFinished,
		Dollar:             true,
		Parallel:           true,
		TxOwned:            ErrTxOwned,
		SQLCommits:         []string{"COMMIT", "END", "COMMIT AND CHAIN"},
		SQLRollbacks:       []string{"ROLLBACK", "ABORT"},
		RefusesAfterSQLEnd: true,
		// The deferred statements travel ahead of the fenced complete.
		DeferredBeforeFence: true,
		Counted: func(t *testing.T) (*txtest.Env, txtest.Counter) {
			tr := &countingTracer{}
			cfg := pgstoretest.Config(t)
			cfg.MaxConns = 1 // one connection: statements prepared once, then cached
			cfg.ConnConfig.Tracer = tr
			// The claim function first, as during a retry storm: one
			// statement per claim whatever it finds (the bare insert
			// first, and the switch between the two: TestQueryCountsClaim).
			return txEnv(t, newStore(t, pgstoretest.NewPool(t, cfg), append([]Option{withFunctionFirst()}, opts...)...)), tr
		},
		// Statements (a batch counts as one; round trips: TestTxRoundTrips).
		Counts: map[string]int{
			"first claim":     2, // the schema check, once per Store
			"first heartbeat": 1, "first complete": 1, "first get": 1, "claim and first fail": 2,
			"claim (new key)": 1, "claim (in flight)": 1, "heartbeat": 1, "fail": 1, "claim (takeover)": 1,
			"complete": 1, "claim (replay)": 1, "get": 1,
			"first Tx": 0, "Tx": 0, "Tx again": 0, // Tx sends nothing
			"insert in tx":    1, // BEGIN rides with the handler's first statement
			"complete in tx":  1, // the fenced UPDATE and COMMIT, one batch
			"fail in tx":      1, // ROLLBACK and the fenced UPDATE
			"first save step": 1, "save step": 1, "first load steps": 1, "load steps": 1,
			"Defer":                        0, // queued, sent at Complete
			"complete with deferred":       1, // BEGIN, the deferred statements, the fenced UPDATE, COMMIT: one batch
			"complete in tx with deferred": 1,
			"fail with deferred":           1, // the fenced UPDATE only
		},
	}
}

// txEnv is s as txtest sees it, with an empty ledger table.
func txEnv(t *testing.T, s *Store) *txtest.Env {
	pool := s.pool
	exec := func(t *testing.T, q string, args ...any) {
		t.Helper()
		_, err := pool.Exec(context.Background(), q, args...)
		require.NoError(t, err, q)
	}
	ledger := pgx.Identifier{s.cfg.schema, "ledger"}.Sanitize()
	exec(t, "CREATE TABLE "+ledger+" (k text NOT NULL, owner bigint NOT NULL)")
	return &txtest.Env{
		Store: s, Ledger: ledger, Ints: poolInts(pool),
		InUse: func() int { return int(pool.Stat().AcquiredConns()) },
		Lapse: func(t *testing.T, scope, key string) {
			exec(t, "UPDATE "+s.names.table+" SET locked_until = now() - interval '1 second' WHERE scope = $1 AND key = $2", scope, key)
		},
		Refuse: func(t *testing.T, _ string) func() { return refuse(t, s) },
	}
}

// refuse makes PostgreSQL refuse every insert and update of s's records,
// with the row's key in the error's message, until undo.
func refuse(t *testing.T, s *Store) (undo func()) {
	exec := func(q string) {
		_, err := s.pool.Exec(context.Background(), q)
		require.NoError(t, err, q)
	}
	fn := pgx.Identifier{s.cfg.schema, "refuse"}.Sanitize()
	exec("CREATE OR REPLACE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused %', NEW.key; END $$")
	exec("CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON " + s.names.table + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()")
	return func() { exec("DROP TRIGGER refuse ON " + s.names.table) }
}

func poolInts(pool *pgxpool.Pool) func(ctx context.Context, q string, args ...any) ([]int64, error) {
	return func(ctx context.Context, q string, args ...any) ([]int64, error) {
		rows, err := pool.Query(ctx, q, args...)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[int64])
	}
}

// pgTx is a pgx.Tx as txtest.Tx.
type pgTx struct{ pgx.Tx }

func (p pgTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := p.Tx.Exec(ctx, q, args...)
	return err
}

// Reset and Count make countingTracer a txtest.Counter.
func (c *countingTracer) Reset() { c.reset() }

func (c *countingTracer) Count() (int, string) {
	sqls, _ := c.snapshot()
	for i, q := range sqls {
		sqls[i] = short(q)
	}
	return len(sqls), strings.Join(sqls, "; ")
}
