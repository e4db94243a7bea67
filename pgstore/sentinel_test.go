package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest/txtest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestSentinelRealErrors drives the sentinel keys into PostgreSQL's real
// failures, in plain and transactional mode (a statement in the lease's
// transaction before the commit): a backend terminated while the claim or
// the commit waits on a row lock, a lock timeout on both, and a trigger
// refusing the record's write with the key in its message.
func TestSentinelRealErrors(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []Option
	}{{"plain", nil}, {"transactional", []Option{WithTransactional()}}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sn := txtest.Sentinel{Failures: []txtest.Failure{
				lockFailure("terminate", "57P01", mode.opts), lockFailure("lock_timeout", "55P03", mode.opts),
				{Name: "refused", Signs: []string{"P0001"}, Open: func(t *testing.T, _ io.Writer) (storekit.Store, func(string, func() error) error) {
					s := newStore(t, pgstoretest.Pool(t), mode.opts...)
					return s, func(_ string, op func() error) error { undo := refuse(t, s); defer undo(); return op() }
				}},
			}}
			if mode.opts != nil {
				sn.Handler = func(ctx context.Context) error {
					tx, err := Tx(ctx)
					if err == nil {
						_, err = tx.Exec(ctx, "SELECT 1")
					}
					return err
				}
			}
			txtest.RunSentinel(t, sn)
		})
	}
}

// lockFailure: the claim or commit waits on the record's row, locked by
// another session, until the store's backend is terminated ("terminate")
// or its lock_timeout fires ("lock_timeout").
func lockFailure(name, sqlstate string, opts []Option) txtest.Failure {
	open := func(t *testing.T, _ io.Writer) (storekit.Store, func(string, func() error) error) {
		var b [6]byte
		_, _ = rand.Read(b[:])
		app := "idem-sentinel-" + hex.EncodeToString(b[:])
		cfg := pgstoretest.Config(t)
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		if name == "lock_timeout" {
			cfg.ConnConfig.RuntimeParams["lock_timeout"] = "100ms"
		}
		// Migrated on the admin pool: the migration's advisory lock would
		// hit the lock timeout when tests run in parallel.
		admin := pgstoretest.Pool(t)
		opts := append([]Option{WithSchema(pgstoretest.Schema(t, admin))}, opts...)
		openStore(t, admin, opts...)
		s, err := New(pgstoretest.NewPool(t, cfg), opts...)
		require.NoError(t, err)
		t.Cleanup(s.Close)
		ctx := t.Context()
		table := pgx.Identifier{s.cfg.schema, s.cfg.table}.Sanitize()
		return s, func(key string, op func() error) error {
			lock := func() func() {
				tx, err := admin.Begin(ctx)
				require.NoError(t, err)
				var n int
				err = tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM "+table+" WHERE scope = 'tenant' AND key = $1 FOR UPDATE) l", key).Scan(&n)
				require.NoError(t, err)
				require.Equal(t, 1, n, "lock the record")
				return func() { _ = tx.Rollback(context.Background()) }
			}
			var kill func() error
			if name == "terminate" {
				kill = func() error {
					for deadline := time.Now().Add(30 * time.Second); ; {
						// The statement waiting on the record's lock: a claim
						// may send a bare insert first (it does not wait on
						// the lock) on another connection, and ending that one
						// would leave the claim waiting as long as the lock.
						var pid int
						err := admin.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND wait_event_type = 'Lock'", app).Scan(&pid)
						if err == nil {
							_, err = admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
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
	return txtest.Failure{Name: name, Signs: []string{sqlstate, "conn closed", "unexpected EOF"}, Open: open}
}
