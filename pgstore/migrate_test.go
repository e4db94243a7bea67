package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestMigrateConcurrent: several instances start at once and all migrate
// the same, not yet existing, schema (both modes, two tables): no error, each
// step applied once, and the store works.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 8
	pool := pgstoretest.NewPool(t, cfg)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "idemtest_mig_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	plain := []Option{WithSchema(schema), WithTable("plain_records")}
	parted := []Option{WithSchema(schema), WithTable("parted_records"), WithPartitioning(2)}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 12 {
		opts := plain
		if i%2 == 1 {
			opts = parted
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := Migrate(t.Context(), pool, opts...); err != nil {
				t.Errorf("concurrent migrate: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	var applied int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{schema, "idem_schema_migrations"}.Sanitize()).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, opts := range [][]Option{plain, parted} {
		cfg, err := newConfig(opts)
		if err != nil {
			t.Fatal(err)
		}
		migs, err := loadMigrations(cfg)
		if err != nil {
			t.Fatal(err)
		}
		want += len(migs)
	}
	if applied != want {
		t.Errorf("%d migration rows, want %d (each step once per table)", applied, want)
	}
	for _, opts := range [][]Option{plain, parted} {
		s := openStore(t, pool, opts...) // migrates again: idempotent
		completeKey(t, s, claimReq("k", time.Minute), "ok")
		requireReplay(t, s, claimReq("k", time.Minute), "ok")
	}
	// Switching modes is refused.
	err := Migrate(t.Context(), pool, WithSchema(schema), WithTable("plain_records"), WithPartitioning(2))
	if err == nil || !strings.Contains(err.Error(), "plain mode") {
		t.Errorf("migrating a plain table as partitioned: %v, want a mode error", err)
	}
}

func TestMigrateErrors(t *testing.T) {
	if err := Migrate(t.Context(), nil); err == nil {
		t.Error("Migrate(nil pool) succeeded")
	}
	pool := pgstoretest.Pool(t)
	if err := Migrate(t.Context(), pool, WithTable("bad name")); err == nil {
		t.Error("Migrate with an invalid table succeeded")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := Migrate(ctx, pool, WithSchema(pgstoretest.Schema(t, pool))); err == nil || !strings.HasPrefix(err.Error(), "pgstore: migrate") {
		t.Errorf("Migrate with a cancelled context: %v", err)
	}
}

// TestPreviousReleaseClaimDuringRollingDeploy: after Migrate to this
// version, a binary of the previous release still calls migration 0002's
// set-returning claim function. Both functions must keep working on the
// same rows: a key claimed and completed through one is replayed through
// the other, and neither claims it twice.
func TestPreviousReleaseClaimDuringRollingDeploy(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			pool := pgstoretest.Pool(t)
			s := newStore(t, pool, m.opts...)
			ctx := t.Context()
			previous := `SELECT o_claimed, o_token, o_status FROM ` + s.names.claimFn + `($1, $2, 'POST', '/v1/payments', 'f00d', 60000000, 3600000000, now())`

			// Claimed by the previous release, completed, replayed by this one.
			var claimed bool
			var token int64
			var status string
			if err := pool.QueryRow(ctx, previous, "tenant", "old-first").Scan(&claimed, &token, &status); err != nil || !claimed {
				t.Fatalf("previous release's claim: claimed=%v %v", claimed, err)
			}
			if err := s.Complete(ctx, storekit.Fence{Scope: "tenant", Key: "old-first", Token: token}, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
				t.Fatal(err)
			}
			res, err := s.Claim(ctx, claimReq("old-first", time.Minute))
			if err != nil || res.Claimed || res.Record.Token != token || res.Record.Response == nil || string(res.Record.Response.Body) != "ok" {
				t.Fatalf("this release's replay: %+v %v", res, err)
			}

			// Claimed by this release; the previous release sees it in flight.
			res, err = s.Claim(ctx, claimReq("new-first", time.Minute))
			if err != nil || !res.Claimed {
				t.Fatalf("this release's claim: %+v %v", res, err)
			}
			if err := pool.QueryRow(ctx, previous, "tenant", "new-first").Scan(&claimed, &token, &status); err != nil || claimed ||
				token != res.Record.Token || status != string(storekit.StatusProcessing) {
				t.Fatalf("previous release's duplicate: claimed=%v token=%d status=%s %v", claimed, token, status, err)
			}
		})
	}
}
