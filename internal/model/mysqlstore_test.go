package model

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/mytest"
	"github.com/idemkit/idem/mysqlstore"
)

// myEnvs migrates mysqlstore into a fresh database and returns the Env of
// each history (its own scope, one store). Lapse, Expire and Kill run on a
// connection to another database, so that Kill, which ends one connection
// of the fresh database (KILL CONNECTION), never ends its own or another
// test's.
func myEnvs(t *testing.T) func(h int) *Env {
	t.Helper()
	cfg := mytest.Database(t, "")
	db := mytest.Open(t, cfg)
	admin := mytest.Open(t, mytest.Config(t, ""))
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
	return func(h int) *Env {
		return &Env{
			Store:  store,
			Scope:  fmt.Sprintf("h%d", h),
			Lapse:  lapse("locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 DAY"),
			Expire: lapse("locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 DAY, expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 DAY"),
			Kill:   kill,
			// Its claim procedure reads the record back after its COMMIT:
			// see TestMysqlstoreClaimReadBack. IDEM_MODEL_ATOMIC_CLAIM=1
			// checks its claims as atomic, and shows the finding.
			ClaimReadBack: os.Getenv("IDEM_MODEL_ATOMIC_CLAIM") != "1",
		}
	}
}

func TestMysqlstore(t *testing.T) {
	t.Parallel()
	sum, fails := Run(context.Background(), killConfig(t, 40), myEnvs(t))
	Report(t, "mysqlstore", fails)
	covered(t, sum, true)
}
