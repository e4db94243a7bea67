package mysqlstore

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storetest/txtest"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestTxContract runs the transactional stores' contract. mysqlstore has
// commit marks, lets the handler end the transaction itself, and after a
// ROLLBACK sent as SQL completes the record as not retained: the server
// runs what the handler sends afterwards in autocommit, unseen.
func TestTxContract(t *testing.T) { txtest.Run(t, txHarness) }

var txHarness = txtest.Harness{
	New: func(t *testing.T) *txtest.Env {
		db := mysqlstoretest.NewDB(t, "")
		return txEnv(t, db, openStore(t, db))
	},
	Tx: func(ctx context.Context) (txtest.Tx, error) {
		tx, err := Tx(ctx)
		if err != nil {
			return nil, err
		}
		return txtest.SQLTx(tx), nil
	},
	Defer:            Defer,
	ErrNoLease:       ErrNoLease,
	ErrLeaseFinished: ErrLeaseFinished,
	CommitMarks:      true,
	// The takeover's locking read of the commit mark waits for the
	// lapsed owner's transaction (migration 0006).
	TakeoverWaitsForTx: true,
	SQLRollbackErr:     ErrTxRolledByServer,
	// A gap (see Tx: "Do not send COMMIT or BEGIN as SQL"): after a COMMIT
	// sent as SQL, Complete's statements autocommit one by one.
	SQLCommitUnseen: true,
	Counted: func(t *testing.T) (*txtest.Env, txtest.Counter) {
		c := &commandCounter{}
		cfg := mysqlstoretest.Database(t, "")
		cfg.DialFunc = c.dial
		db := mysqlstoretest.Open(t, cfg)
		db.SetMaxOpenConns(1) // one connection: each statement prepared once
		return txEnv(t, db, openStore(t, db)), c
	},
	// Round trips, counted on the wire. A statement with arguments the
	// handler sends, or queues with Defer, costs two (prepare, execute;
	// the close waits for no answer): the driver prepares it.
	Counts: map[string]int{
		"first claim":     5,                                                                 // the schema and Galera checks, once per Store; prepare + CALL
		"first heartbeat": 2, "first complete": 2, "first get": 2, "claim and first fail": 3, // prepared at first use
		"first save step": 2, "first load steps": 2,
		// A new key is one CALL of its cheap claim (migration 0007); while
		// most keys are new it is tried first, so an existing key costs a
		// SELECT after it (Get's, prepared by "first get"), and a claimable
		// one a CALL of the claim procedure too (prepared at its first use,
		// "claim (takeover)").
		"claim (new key)": 1, "claim (in flight)": 2, "heartbeat": 1, "fail": 1, "claim (takeover)": 4,
		"save step": 1, "load steps": 1, "complete": 1, "claim (replay)": 2, "get": 1,
		"first Tx":                     3, // prepare the complete in it, START TRANSACTION, the commit mark
		"Tx":                           2, // START TRANSACTION, the commit mark
		"Tx again":                     0,
		"insert in tx":                 2,
		"complete in tx":               3, // the fenced UPDATE, DELETE the mark, COMMIT
		"fail in tx":                   3, // the mark seen?, ROLLBACK, the fenced UPDATE
		"Defer":                        0, // queued, sent at Complete: database/sql cannot pipeline
		"complete with deferred":       5, // START TRANSACTION, the fenced UPDATE, the INSERT (2), COMMIT
		"complete in tx with deferred": 5, // the fenced UPDATE, DELETE the mark, the INSERT (2), COMMIT
		"fail with deferred":           1,
	},
}

// txEnv is s on db as txtest sees it, with an empty ledger table.
func txEnv(t *testing.T, db *sql.DB, s *Store) *txtest.Env {
	exec := func(t *testing.T, q string, args ...any) {
		t.Helper()
		_, err := db.Exec(q, args...)
		require.NoError(t, err, q)
	}
	exec(t, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARBINARY(255) NOT NULL, owner BIGINT NOT NULL)")
	return &txtest.Env{
		Store: s, Ledger: "ledger", Ints: txtest.SQLInts(db),
		InUse: func() int { return db.Stats().InUse },
		Lapse: func(t *testing.T, scope, key string) {
			exec(t, "UPDATE "+s.names.table+" SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE scope = ? AND `key` = ?", scope, key)
		},
		Refuse: func(t *testing.T, _ string) func() {
			for _, op := range []string{"INSERT", "UPDATE"} {
				// MESSAGE_TEXT holds 128 characters: a long key's head.
				exec(t, "CREATE TRIGGER refuse_"+op+" BEFORE "+op+" ON "+s.names.table+` FOR EACH ROW BEGIN
					DECLARE msg VARCHAR(128) DEFAULT LEFT(CONCAT('refused ', CONVERT(NEW.`+"`key`"+` USING utf8mb4)), 128);
					SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = msg;
				END`)
			}
			return func() { exec(t, "DROP TRIGGER refuse_INSERT"); exec(t, "DROP TRIGGER refuse_UPDATE") }
		},
		Marks: func(t *testing.T) int { return markRows(t, db) },
	}
}

// Reset and Count make commandCounter a txtest.Counter.
func (c *commandCounter) Reset()               { c.reset() }
func (c *commandCounter) Count() (int, string) { return c.roundTrips() }
