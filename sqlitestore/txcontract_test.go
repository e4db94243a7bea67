package sqlitestore

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storetest/txtest"
)

// TestTxContract runs the transactional stores' contract: SQLite has one
// writer (the lease transaction holds the write lock from its first
// statement) and commit marks; a handler may end the transaction itself.
func TestTxContract(t *testing.T) { txtest.Run(t, txHarness) }

var txHarness = txtest.Harness{
	New: func(t *testing.T) *txtest.Env { db, _ := newDB(t); return txEnv(t, db, openStore(t, db)) },
	Tx: func(ctx context.Context) (txtest.Tx, error) {
		tx, err := Tx(ctx)
		if err != nil {
			return nil, err
		}
		return txtest.SQLTx(tx), nil
	},
	Defer:              Defer,
	ErrNoLease:         ErrNoLease,
	ErrLeaseFinished:   ErrLeaseFinished,
	Parallel:           true,
	CommitMarks:        true,
	TakeoverWaitsForTx: true,
	// A gap: SQLite's rollback (a ROLLBACK sent as SQL, an interrupted
	// statement) releases the key, though what the handler ran on the
	// transaction after it autocommitted; mysqlstore completes the record
	// as not retained instead, pgstore refuses those statements.
	ReleasesAfterSQLRollbackWrites: true,
	Counted: func(t *testing.T) (*txtest.Env, txtest.Counter) {
		db, c := countedDB(t)
		return txEnv(t, db, openStore(t, db)), c
	},
	// Statements SQLite runs (no round trips: it is in-process).
	Counts: map[string]int{
		"first claim":          9, // the schema check, once per Store
		"claim and first fail": 10,
		// A plain read; a claimable key then one write transaction:
		// BEGIN, the token, the clock, the record again, its commit
		// mark, the upsert, COMMIT.
		"claim (new key)": 7, "claim (takeover)": 7,
		"claim (in flight)": 1, "claim (replay)": 1,
		// Every write is a transaction the writes queued beside it may
		// share (writer.go): BEGIN, the fenced statement, COMMIT.
		"first heartbeat": 3, "first complete": 3, "first get": 1,
		"heartbeat": 3, "fail": 3, "complete": 3, "get": 1,
		"first save step": 3, "save step": 3, "first load steps": 1, "load steps": 1,
		"first Tx": 2, "Tx": 2, "Tx again": 0, // BEGIN IMMEDIATE, the commit mark
		"insert in tx":   1,
		"complete in tx": 4, // still in it? (BEGIN refused), DELETE the mark, the fenced UPDATE, COMMIT
		"fail in tx":     5, // still in it?, ROLLBACK, BEGIN, the fenced UPDATE, COMMIT
		"Defer":          0,
		// BEGIN, the fenced UPDATE, the INSERT, COMMIT
		"complete with deferred": 4,
		// still in it?, DELETE the mark, the fenced UPDATE, the INSERT, COMMIT
		"complete in tx with deferred": 5,
		"fail with deferred":           3,
	},
}

// txEnv is s on db as txtest sees it, with an empty ledger table.
func txEnv(t *testing.T, db *sql.DB, s *Store) *txtest.Env {
	exec := func(t *testing.T, q string, args ...any) {
		t.Helper()
		_, err := db.Exec(q, args...)
		require.NoError(t, err, q)
	}
	exec(t, "CREATE TABLE ledger (k TEXT NOT NULL, owner INTEGER NOT NULL)")
	return &txtest.Env{
		Store: s, Ledger: "ledger", Ints: txtest.SQLInts(db),
		InUse: func() int { return db.Stats().InUse },
		Lapse: func(t *testing.T, scope, key string) {
			exec(t, "UPDATE "+s.names.table+" SET locked_until = 0 WHERE scope = ? AND key = ?", []byte(scope), []byte(key))
		},
		Refuse: func(t *testing.T, key string) func() {
			msg := "'refused " + strings.ReplaceAll(key, "'", "''") + "'"
			for _, op := range []string{"INSERT", "UPDATE"} {
				exec(t, "CREATE TRIGGER refuse_"+op+" BEFORE "+op+" ON "+s.names.table+" BEGIN SELECT RAISE(ABORT, "+msg+"); END")
			}
			return func() { exec(t, "DROP TRIGGER refuse_INSERT"); exec(t, "DROP TRIGGER refuse_UPDATE") }
		},
		Marks: func(t *testing.T) int {
			n, err := txtest.SQLInts(db)(t.Context(), "SELECT COUNT(*) FROM "+s.names.txMarks)
			require.NoError(t, err)
			return int(n[0])
		},
	}
}
