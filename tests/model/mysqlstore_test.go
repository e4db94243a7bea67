package model

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// myEnvs migrates mysqlstore into a fresh database and returns the Env of
// each history (its own scope, one store). Lapse, Expire and Kill run on a
// connection to another database, so that Kill, which ends one connection
// of the fresh database (KILL CONNECTION), never ends its own or another
// test's.
//
// Transactional: every Complete and Fail comes after a ledger write in the
// lease's transaction (mysqlstore.Tx, or mysqlstore.Defer for even tokens
// whose handler does not end its transaction); Audit reads the ledger. The
// handler of every other lease also ends that transaction itself before idem
// completes, as `defer tx.Rollback()` does (issue 19, defect 1): its
// Complete must then not record the response (storekit.ErrNotCommitted) and
// may only release the key. Some handlers commit their transaction
// themselves (CommitCrash) and crash before Complete: a takeover must
// complete their record as not retained, never run them again; or go on
// (CommitThenFinish): Complete records the response, Fail completes the
// record as not retained.
func myEnvs(t *testing.T, transactional bool) func(h int) *Env {
	t.Helper()
	cfg := mysqlstoretest.Database(t, "")
	db := mysqlstoretest.Open(t, cfg)
	admin := mysqlstoretest.Open(t, mysqlstoretest.Config(t, ""))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := mysqlstore.Migrate(ctx, db); err != nil {
		t.Fatalf("mysqlstore.Migrate: %v", err)
	}
	store, err := mysqlstore.New(db)
	if err != nil {
		t.Fatalf("mysqlstore.New: %v", err)
	}
	t.Cleanup(store.Close)
	table := "`" + cfg.DBName + "`.`idem_records`"
	// A day in the past, as for pgstore.
	lapse := func(set string) func(ctx context.Context, scope, key string) error {
		q := "UPDATE " + table + " SET " + set + " WHERE scope = ? AND `key` = ?"
		return func(ctx context.Context, scope, key string) error {
			_, err := admin.ExecContext(ctx, q, scope, key)
			return err
		}
	}
	kill := func(ctx context.Context) error {
		var id int64
		err := admin.QueryRowContext(ctx, "SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID() ORDER BY RAND() LIMIT 1", cfg.DBName).Scan(&id)
		if err == sql.ErrNoRows {
			return nil
		}
		if err != nil {
			return err
		}
		_, err = admin.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
		return err
	}
	ledger := "`" + cfg.DBName + "`.`ledger`"
	if _, err := admin.ExecContext(ctx, "CREATE TABLE "+ledger+" (scope VARBINARY(64) NOT NULL, `key` VARBINARY(64) NOT NULL, token BIGINT NOT NULL)"); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	endsTx := handlerEndsTx()
	return func(h int) *Env {
		env := &Env{
			Store:  store,
			Scope:  fmt.Sprintf("h%d", h),
			Lapse:  lapse("locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 DAY"),
			Expire: lapse("locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 DAY, expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 DAY"),
			Kill:   kill,
			// Claims are checked as atomic: the claim procedure reads its
			// answer inside its transaction (migration 0006; before it,
			// see TestMysqlstoreClaimReadBack).
		}
		if !transactional {
			return env
		}
		env.BusinessWrite = func(ctx context.Context, f storekit.Fence) error {
			if f.Token%2 == 0 && !endsTx(f) {
				// Half the leases queue the row with Defer: it commits
				// with the complete (or is dropped by Fail).
				return mysqlstore.Defer(ctx, "INSERT INTO "+ledger+" (scope, `key`, token) VALUES (?, ?, ?)", f.Scope, f.Key, f.Token)
			}
			tx, err := mysqlstore.Tx(ctx)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, "INSERT INTO "+ledger+" (scope, `key`, token) VALUES (?, ?, ?)", f.Scope, f.Key, f.Token)
			if endsTx(f) {
				_ = tx.Rollback()
			}
			return err
		}
		env.HandlerEndsTx = endsTx
		env.CommitThenFinish = true
		env.CommitSelf = func(ctx context.Context, f storekit.Fence) error {
			tx, err := mysqlstore.Tx(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+ledger+" (scope, `key`, token) VALUES (?, ?, ?)", f.Scope, f.Key, f.Token); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
		env.Audit = func(ctx context.Context, scope, key string) ([]int64, error) {
			return ledgerTokens(admin.QueryContext(ctx, "SELECT token FROM "+ledger+" WHERE scope = ? AND `key` = ? ORDER BY token", scope, key))
		}
		return env
	}
}

func TestMysqlstore(t *testing.T) {
	t.Parallel()
	sum, fails := Run(context.Background(), killConfig(t, 40), myEnvs(t, false))
	Report(t, "mysqlstore", fails)
	covered(t, sum, true)
}

// TestMysqlstoreTransactional: Complete commits the handler's transaction
// (mysqlstore.Tx) with the response, Fail rolls it back; the ledger must
// hold a token exactly when its Complete took effect. Handlers that roll
// their transaction back themselves (see myEnvs) must get no response
// recorded.
func TestMysqlstoreTransactional(t *testing.T) {
	t.Parallel()
	sum, fails := Run(context.Background(), killConfig(t, 30), myEnvs(t, true))
	Report(t, "mysqlstore-tx", fails)
	txCovered(t, sum)
}
