package pgstore

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestConformance runs storetest on each mode, as configured by default and
// in other ways:
//
//   - function_first: every claim calls the claim function, never the
//     bare insert first (by default only while a quarter or half of
//     recent claims find their key, see Claim);
//   - batching: batching pinned at one statement in flight,
//     so that concurrent claims and completes share statements under any
//     load (the default adapts: on a quiet database each goes alone);
//   - unbatched: WithoutBatching;
//   - exec and simple_protocol: pools configured the ways the README
//     suggests behind PgBouncer in transaction mode, without prepared
//     statements (QueryExecModeExec) or with the simple protocol, where
//     every result comes back as text and the claim's binary composite
//     cannot be asked for;
//   - transactional: WithTransactional (claims, heartbeats committed
//     without waiting for their flush: other statements), alone and
//     on the simple protocol.
//
// Every variant runs with WithRetentionMargin(0), so that the suite's
// Incarnation/NewAfterSweep case sees Sweep delete its expired record (it
// fails otherwise). The margin is read by Sweep and Maintain only; TestSweep
// checks that a record expired less than the margin ago is kept.
func TestConformance(t *testing.T) {
	type variant struct {
		name     string
		execMode pgx.QueryExecMode // 0: pgx's default
		opts     []Option
	}
	var variants []variant
	for _, m := range modes {
		variants = append(variants,
			variant{m.name, 0, m.opts},
			variant{m.name + "/function_first", 0, append([]Option{withFunctionFirst()}, m.opts...)},
			variant{m.name + "/batching", 0, append([]Option{withBatchLimit(1)}, m.opts...)},
			variant{m.name + "/unbatched", 0, append([]Option{WithoutBatching()}, m.opts...)},
			variant{m.name + "/exec", pgx.QueryExecModeExec, m.opts},
			variant{m.name + "/simple_protocol", pgx.QueryExecModeSimpleProtocol, m.opts},
			variant{m.name + "/transactional", 0, append([]Option{WithTransactional()}, m.opts...)},
			variant{m.name + "/transactional/simple_protocol", pgx.QueryExecModeSimpleProtocol, append([]Option{WithTransactional()}, m.opts...)},
		)
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgstoretest.Config(t)
			cfg.MaxConns = 4
			if v.execMode != 0 {
				cfg.ConnConfig.DefaultQueryExecMode = v.execMode
			}
			pool := pgstoretest.NewPool(t, cfg)
			opts := append([]Option{WithRetentionMargin(0)}, v.opts...)
			storetest.Run(t, func(tb testing.TB) core.Store {
				return newStore(tb, pool, opts...)
			})
		})
	}
}
