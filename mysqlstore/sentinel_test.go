package mysqlstore

import (
	"io"
	"log"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest/txtest"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestSentinelRealErrors drives the sentinel keys into MariaDB's real
// failures: the store's own connection killed (KILL CONNECTION) while its
// claim or commit waits on a row lock, a lock wait timeout (1205) on both,
// and a trigger refusing the record's write with the key in its message
// (SIGNAL: MESSAGE_TEXT holds 128 characters, so a long key's head only).
func TestSentinelRealErrors(t *testing.T) {
	txtest.RunSentinel(t, txtest.Sentinel{Failures: []txtest.Failure{
		lockFailure("kill", "invalid connection"), lockFailure("lock_wait_timeout", "1205"),
		{Name: "refused", Signs: []string{"45000"}, Open: func(t *testing.T, _ io.Writer) (storekit.Store, func(string, func() error) error) {
			db := mysqlstoretest.NewDB(t, "")
			e := txEnv(t, db, openStore(t, db))
			return e.Store, func(key string, op func() error) error { undo := e.Refuse(t, key); defer undo(); return op() }
		}},
	}})
}

// lockFailure: the claim or commit waits on the record's row, locked by
// another session, until the store's connection is killed ("kill": only
// that one, never the locker nor another test's) or the lock wait times
// out ("lock_wait_timeout").
func lockFailure(name, sign string) txtest.Failure {
	open := func(t *testing.T, logw io.Writer) (storekit.Store, func(string, func() error) error) {
		cfg := mysqlstoretest.Database(t, "")
		locker := mysqlstoretest.Open(t, cfg.Clone())
		admin := mysqlstoretest.Open(t, mysqlstoretest.Config(t, ""))
		if name == "lock_wait_timeout" {
			cfg.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
		}
		// The driver's own log ("unexpected EOF" on a killed connection)
		// is a log line too.
		cfg.Logger = log.New(logw, "[mysql] ", 0)
		// No retries: the first 1205 is the error (retries would only repeat it).
		s := openStore(t, mysqlstoretest.Open(t, cfg), WithDeadlockRetries(0))
		ctx := t.Context()
		return s, func(key string, op func() error) error {
			var lockerID int64
			lock := func() func() {
				tx, err := locker.BeginTx(ctx, nil)
				require.NoError(t, err)
				require.NoError(t, tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&lockerID))
				var n int
				require.NoError(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT token FROM "+s.cfg.Table+" WHERE scope = 'tenant' AND `key` = ? FOR UPDATE) l", key).Scan(&n))
				require.Equal(t, 1, n, "lock the record")
				return func() { _ = tx.Rollback() }
			}
			var kill func() error
			if name == "kill" {
				kill = func() error {
					for deadline := time.Now().Add(30 * time.Second); ; {
						var id int64
						err := admin.QueryRowContext(ctx, "SELECT id FROM information_schema.PROCESSLIST WHERE db = ? AND id <> ? AND command IN ('Query', 'Execute')",
							cfg.DBName, lockerID).Scan(&id)
						if err == nil {
							_, err = admin.ExecContext(ctx, "KILL CONNECTION ?", id)
							return err
						}
						if time.Now().After(deadline) {
							return err
						}
						time.Sleep(5 * time.Millisecond) // polling the server's state, not standing in for it
					}
				}
			}
			return txtest.WhileLocked(t, lock, kill, op)
		}
	}
	return txtest.Failure{Name: name, Signs: []string{sign, "bad connection", "1927", "1317"}, Open: open}
}
