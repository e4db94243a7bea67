package model

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// pgLedger is how a transactional run writes the ledger row of a lease.
type pgLedger int

const (
	noLedger pgLedger = iota
	// txOrDefer: pgstore.Tx for odd tokens, pgstore.Defer for even ones.
	txOrDefer
	// deferAll: pgstore.Defer for every lease, as examples/payments books
	// its ledger row.
	deferAll
)

// pgSetup configures a pgstore run: the store's options (beyond
// WithSchema), its ledger writes, and a tracer on the store's pool.
type pgSetup struct {
	opts   []pgstore.Option
	ledger pgLedger
	tracer pgx.QueryTracer
}

// pgEnvs is pgStore plain, or WithTransactional with txOrDefer ledger rows.
func pgEnvs(t *testing.T, transactional bool) func(h int) *Env {
	t.Helper()
	// Without a ledger, every request sends its own statements: the model
	// runs both paths (the others batch as configured by default).
	s := pgSetup{opts: []pgstore.Option{pgstore.WithoutBatching()}}
	if transactional {
		s = pgSetup{opts: []pgstore.Option{pgstore.WithTransactional()}, ledger: txOrDefer}
	}
	envs, _ := pgStore(t, s)
	return envs
}

// pgStore migrates pgstore into a fresh schema and returns the Env of
// each history (its own scope, one store) and the store. The store's pool
// carries a unique application_name: Kill terminates one of those
// backends, never another test's. Lapse, Expire, Audit and Kill run on a
// second pool.
//
// With a ledger, every Complete and Fail comes after a ledger write in the
// lease's transaction (pgstore.Tx or pgstore.Defer, see pgLedger); Audit
// reads the ledger.
func pgStore(t *testing.T, setup pgSetup) (func(h int) *Env, *pgstore.Store) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	app := "idem_model_" + hex.EncodeToString(b[:])
	cfg := pgstoretest.Config(t)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.Tracer = setup.tracer
	pool := pgstoretest.NewPool(t, cfg)
	admin := pgstoretest.NewPool(t, pgstoretest.Config(t))
	schema := pgstoretest.Schema(t, admin)
	opts := append([]pgstore.Option{pgstore.WithSchema(schema)}, setup.opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgstore.Migrate(ctx, pool, opts...); err != nil {
		t.Fatalf("pgstore.Migrate: %v", err)
	}
	store, err := pgstore.New(pool, opts...)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	t.Cleanup(store.Close)
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE TABLE "+ledger+" (scope text NOT NULL, key text NOT NULL, token bigint NOT NULL)"); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	// A day in the past: before the clock of any statement of the run
	// (now() is the transaction's start), so no claim sees the lease live.
	lapse := func(set string) func(ctx context.Context, scope, key string) error {
		q := "UPDATE " + table + " SET " + set + " WHERE scope = $1 AND key = $2"
		return func(ctx context.Context, scope, key string) error {
			_, err := admin.Exec(ctx, q, scope, key)
			return err
		}
	}
	kill := func(ctx context.Context) error {
		_, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1`, app)
		return err
	}
	return func(h int) *Env {
		env := &Env{
			Store:  store,
			Scope:  fmt.Sprintf("h%d", h),
			Lapse:  lapse("locked_until = now() - interval '1 day'"),
			Expire: lapse("locked_until = now() - interval '1 day', expires_at = now() - interval '1 day'"),
			Kill:   kill,
		}
		if setup.ledger == noLedger {
			return env
		}
		env.BusinessWrite = func(ctx context.Context, f storekit.Fence) error {
			insert := "INSERT INTO " + ledger + " (scope, key, token) VALUES ($1, $2, $3)"
			if setup.ledger == deferAll || f.Token%2 == 0 {
				// Defer: the row travels with the complete (or is
				// dropped by Fail).
				return pgstore.Defer(ctx, insert, f.Scope, f.Key, f.Token)
			}
			tx, err := pgstore.Tx(ctx)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, insert, f.Scope, f.Key, f.Token)
			return err
		}
		if setup.ledger == txOrDefer {
			// Some handlers commit the lease's transaction themselves,
			// each way by its token: with a tag idem reads (Exec), and
			// with none (Query, SendBatch, the connection from Conn).
			// pgstore keeps no commit mark: the handler goes on, and its
			// Complete or Fail asks PostgreSQL whether the COMMIT landed.
			env.CommitWithoutMark = true
			env.CommitSelf = func(ctx context.Context, f storekit.Fence) error {
				tx, err := pgstore.Tx(ctx)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "INSERT INTO "+ledger+" (scope, key, token) VALUES ($1, $2, $3)", f.Scope, f.Key, f.Token); err != nil {
					return err
				}
				return commitSelf(ctx, tx, f.Token)
			}
		}
		env.Audit = func(ctx context.Context, scope, key string) ([]int64, error) {
			rows, err := admin.Query(ctx, "SELECT token FROM "+ledger+" WHERE scope = $1 AND key = $2 ORDER BY token", scope, key)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[int64])
		}
		return env
	}, store
}

// commitSelf commits tx with SQL, in one of four ways chosen by tok: the
// first leaves a COMMIT tag idem reads, the others none.
func commitSelf(ctx context.Context, tx pgx.Tx, tok int64) error {
	switch tok % 4 {
	case 0:
		_, err := tx.Exec(ctx, "COMMIT")
		return err
	case 1:
		rows, err := tx.Query(ctx, "COMMIT")
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	case 2:
		b := &pgx.Batch{}
		b.Queue("COMMIT")
		return tx.SendBatch(ctx, b).Close()
	default:
		c := tx.Conn()
		if c == nil {
			return errors.New("no connection")
		}
		_, err := c.Exec(ctx, "COMMIT")
		return err
	}
}

// killConfig is config with connection kills: about one call in 40 starts
// one, at most 4 per history.
func killConfig(t *testing.T, def int) Config {
	t.Helper()
	cfg := config(t, def)
	cfg.KillEvery, cfg.MaxKills = 40, 4
	return cfg
}

func TestPgstore(t *testing.T) {
	t.Parallel()
	sum, fails := Run(context.Background(), killConfig(t, 40), pgEnvs(t, false))
	Report(t, "pgstore", fails)
	covered(t, sum, true)
}

// TestPgstoreTransactional: Complete commits the handler's transaction
// with the response, Fail rolls it back; the ledger (Audit) must hold a
// token exactly when its Complete took effect.
func TestPgstoreTransactional(t *testing.T) {
	t.Parallel()
	sum, fails := Run(context.Background(), killConfig(t, 40), pgEnvs(t, true))
	Report(t, "pgstore-tx", fails)
	covered(t, sum, true)
	if sum.Histories >= 20 && sum.Count(CommitCrash, OK) == 0 {
		t.Errorf("no handler committed its transaction itself (CommitCrash)")
	}
	if sum.Count(Audit, OK) == 0 {
		t.Errorf("no ledger audit was answered")
	}
}
