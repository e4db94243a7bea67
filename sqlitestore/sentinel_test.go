package sqlitestore

import (
	"context"
	"database/sql"
	"io"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest/txtest"
)

// TestSentinelRealErrors drives the sentinel keys into SQLite's real
// failures: the write lock held by another connection past busy_timeout
// (SQLITE_BUSY), and a trigger refusing the record's write with the key in
// its message.
func TestSentinelRealErrors(t *testing.T) {
	txtest.RunSentinel(t, txtest.Sentinel{Failures: []txtest.Failure{
		{Name: "busy", Signs: []string{"SQLITE_BUSY"}, Open: func(t *testing.T, _ io.Writer) (storekit.Store, func(string, func() error) error) {
			path := filepath.Join(t.TempDir(), "idem.db")
			db, err := sql.Open("sqlite", dsn(path, 100))
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			s := openStore(t, db)
			locker, _ := newDBAt(t, path)
			return s, func(_ string, op func() error) error {
				lock := func() func() {
					conn, err := locker.Conn(t.Context())
					require.NoError(t, err)
					_, err = conn.ExecContext(t.Context(), "BEGIN IMMEDIATE")
					require.NoError(t, err)
					return func() { _, _ = conn.ExecContext(context.Background(), "ROLLBACK"); _ = conn.Close() }
				}
				return txtest.WhileLocked(t, lock, nil, op)
			}
		}},
		{Name: "refused", Signs: []string{"refused"}, Open: func(t *testing.T, _ io.Writer) (storekit.Store, func(string, func() error) error) {
			db, _ := newDB(t)
			e := txEnv(t, db, openStore(t, db))
			return e.Store, func(key string, op func() error) error { undo := e.Refuse(t, key); defer undo(); return op() }
		}},
	}})
}
