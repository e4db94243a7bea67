package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// flushTestPort is this test's throwaway cluster (perf's range, 157xx).
const flushTestPort = 15701

// TestWALFlushes counts WAL flushes (pg_stat_wal.wal_sync) on a cluster of
// its own, where nothing else writes, for n sequential first executions:
//
//   - plain mode: a claim flushes (>= n for n claims), so a first execution
//     in a handler transaction flushes twice;
//   - WithTransactional: a claim does not wait for its flush (a fraction of
//     n: only the WAL writer's own), and a first execution flushes once, at
//     the business commit.
//
// A fail never waits for its flush in either mode. A step (SaveStep)
// always does, even on a session running with synchronous_commit = off,
// where the claims before it do not: the recovery point must be durable
// when SaveStep returns (the CASE in the step statement). So does
// SyncClaim, which RelayKey calls before a key names an asynchronous
// claim's record to a provider.
func TestWALFlushes(t *testing.T) {
	t.Parallel()
	// The WAL writer flushes asynchronous commits every wal_writer_delay;
	// slow it down so that what it does is noise next to n.
	c := pgstoretest.NewCluster(t, flushTestPort, "wal_writer_delay=2s", "autovacuum=off")
	const n = 40

	type run struct {
		name string
		opts []Option
		// per execution: claim only, or claim + handler + complete
		execute bool
		fail    bool
		// step: claim + SaveStep, on a session with synchronous_commit = off
		step bool
		// sync: claim + SyncClaim (a relay key asked for), on a session
		// with synchronous_commit = off
		sync bool
		// async: the session runs with synchronous_commit = off
		async bool
		min   int
		max   int
	}
	runs := []run{
		{name: "plain/claims", min: n, max: 3 * n},
		{name: "transactional/claims", opts: []Option{WithTransactional()}, min: 0, max: n / 4},
		{name: "plain/executions", execute: true, min: 2 * n, max: 4 * n},
		{name: "transactional/executions", opts: []Option{WithTransactional()}, execute: true, min: n, max: n + n/2},
		{name: "transactional/fails", opts: []Option{WithTransactional()}, execute: true, fail: true, min: 0, max: n / 4},
		{name: "plain/fails", execute: true, fail: true, min: n, max: 2 * n}, // the claims'
		{name: "async session/steps", step: true, min: n, max: n + n/2},
		{name: "transactional, async session/synced claims", opts: []Option{WithTransactional()}, sync: true, min: n, max: n + n/2},
		{name: "plain/synced claims", sync: true, min: n, max: n + n/2}, // the claims' own; SyncClaim adds none
		// A session running with synchronous_commit = off makes plain
		// claims asynchronous too: SyncClaim must flush them.
		{name: "plain, async session/synced claims", sync: true, async: true, min: n, max: n + n/2},
		// What a client was told is durable, whatever the session: the
		// complete waits for its flush (the claims before it do not).
		{name: "plain, async session/executions", execute: true, async: true, min: n, max: n + n/2},
		{name: "transactional, async session/executions", opts: []Option{WithTransactional()}, execute: true, async: true, min: n, max: n + n/2},
	}
	ctx := t.Context()
	for i, r := range runs {
		schema := fmt.Sprintf("flush_%d", i)
		var params []string
		if r.step || (r.sync && len(r.opts) > 0) || r.async {
			params = append(params, "synchronous_commit", "off")
		}
		pool := clusterPool(t, c.DSN, params...)
		s := openStore(t, pool, append([]Option{WithSchema(schema)}, r.opts...)...)
		table := ledger(t, s)
		// Warm the connection and the statement cache.
		if _, err := s.Claim(ctx, claimReq("warm", time.Minute)); err != nil {
			t.Fatal(err)
		}
		pool.Close() // backends flush their statistics when they exit

		pool = clusterPool(t, c.DSN, params...)
		s = openStore(t, pool, append([]Option{WithSchema(schema)}, r.opts...)...)
		syncs := walSyncs(t, c.DSN)
		for k := range n {
			req := claimReq(fmt.Sprintf("k%d", k), time.Minute)
			res, err := s.Claim(ctx, req)
			if err != nil || !res.Claimed {
				t.Fatalf("%s: claim: %+v, %v", r.name, res, err)
			}
			f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
			if r.sync {
				if err := s.SyncClaim(ctx, f); err != nil {
					t.Fatalf("%s: sync claim: %v", r.name, err)
				}
				continue
			}
			if r.step {
				if err := s.SaveStep(ctx, f, "charge", []byte("ch")); err != nil {
					t.Fatalf("%s: save step: %v", r.name, err)
				}
				continue
			}
			if !r.execute {
				continue
			}
			hctx := storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
			if err := handle(hctx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			if r.fail {
				err = s.Fail(hctx, f)
			} else {
				err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
			}
			if err != nil {
				t.Fatalf("%s: %v", r.name, err)
			}
		}
		pool.Close()
		syncs = walSyncs(t, c.DSN) - syncs
		t.Logf("%s: %d executions, %d WAL flushes", r.name, n, syncs)
		if syncs < r.min || syncs > r.max {
			t.Errorf("%s: %d WAL flushes for %d, want %d to %d", r.name, syncs, n, r.min, r.max)
		}
	}
}

// clusterPool opens a pool on dsn; params are runtime parameters, name
// then value.
func clusterPool(t *testing.T, dsn string, params ...string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(params); i += 2 {
		cfg.ConnConfig.RuntimeParams[params[i]] = params[i+1]
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// walSyncs reads the cluster's WAL flush count, from a connection of its
// own after the statistics of exited backends have landed.
func walSyncs(t *testing.T, dsn string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	pool := clusterPool(t, dsn)
	defer pool.Close()
	var n int64
	// Backends report their statistics on exit, asynchronously to our
	// pool.Close: wait until the count stops moving.
	last := int64(-1)
	for range 50 {
		if err := pool.QueryRow(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == last {
			break
		}
		last = n
		time.Sleep(100 * time.Millisecond)
	}
	return int(n)
}
