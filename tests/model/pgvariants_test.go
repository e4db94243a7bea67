package model

import (
	"context"
	"testing"

	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest/batchtest"
)

// The configurations users ship, beyond TestPgstore and
// TestPgstoreTransactional: the claim's two paths (the bare insert first,
// the function first) and the switches between them driven both ways (see
// insertFirstMix), examples/payments' configuration, and WithPartitioning. Each with connection kills, fewer histories than the
// two above by default (make model runs IDEM_MODEL_ITER of each).

// pgMixRun runs a store under the model with the other scope's new keys
// that drive its claims' switch.
func pgMixRun(t *testing.T, name string, def int, setup pgSetup, batching bool) Summary {
	t.Helper()
	mix := newInsertFirstMix()
	mix.batching = batching
	if batching { // else the default: the in-flight limit adapts
		setup.opts = append(setup.opts, batchtest.WithLimit(1)) // batches form under any load
	}
	setup.tracer = mix
	envs, store := pgStore(t, setup)
	sum, fails := Run(context.Background(), killConfig(t, def), mix.drive(t, store, envs))
	Report(t, name, fails)
	covered(t, sum, true)
	mix.check(t, sum)
	return sum
}

// TestPgstoreClaimMix: both claim paths and their switches with batching
// pinned at one statement in flight (concurrent claims and completes, the
// history's and the other scope's, share statements).
func TestPgstoreClaimMix(t *testing.T) {
	t.Parallel()
	pgMixRun(t, "pgstore-claim-mix", 20, pgSetup{}, true)
}

// TestPgstoreClaimMixTransactional: the same with WithTransactional (the
// bare insert commits asynchronously too), every ledger row queued with
// pgstore.Defer.
func TestPgstoreClaimMixTransactional(t *testing.T) {
	t.Parallel()
	sum := pgMixRun(t, "pgstore-claim-mix-tx", 20, pgSetup{
		opts: []pgstore.Option{pgstore.WithTransactional()}, ledger: deferAll,
	}, true)
	if sum.Count(Audit, OK) == 0 {
		t.Errorf("no ledger audit was answered")
	}
}

// TestPgstoreExample is examples/payments' configuration (openPG): the
// defaults (the in-flight limit adapts), synchronous claims (not WithTransactional: every
// execution relays a key, which would make the claim durable anyway), and
// the ledger row queued with pgstore.Defer, committed with the response.
func TestPgstoreExample(t *testing.T) {
	t.Parallel()
	sum := pgMixRun(t, "pgstore-example", 20, pgSetup{ledger: deferAll}, false)
	if sum.Count(Audit, OK) == 0 {
		t.Errorf("no ledger audit was answered")
	}
}

// TestPgstorePartitioned: WithPartitioning (ownership state in the records
// table, responses in a day-partitioned payload table written by the
// complete's data-modifying CTE).
func TestPgstorePartitioned(t *testing.T) {
	t.Parallel()
	envs, _ := pgStore(t, pgSetup{opts: []pgstore.Option{pgstore.WithPartitioning(2)}})
	sum, fails := Run(context.Background(), killConfig(t, 20), envs)
	Report(t, "pgstore-partitioned", fails)
	covered(t, sum, true)
}

// TestPgstorePartitionedTransactional: WithPartitioning and
// WithTransactional, the ledger row through pgstore.Tx or pgstore.Defer.
func TestPgstorePartitionedTransactional(t *testing.T) {
	t.Parallel()
	envs, _ := pgStore(t, pgSetup{
		opts:   []pgstore.Option{pgstore.WithPartitioning(2), pgstore.WithTransactional()},
		ledger: txOrDefer,
	})
	sum, fails := Run(context.Background(), killConfig(t, 20), envs)
	Report(t, "pgstore-partitioned-tx", fails)
	covered(t, sum, true)
	if sum.Count(Audit, OK) == 0 {
		t.Errorf("no ledger audit was answered")
	}
}
