package pgstore

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgtest"
)

func TestConformance(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgtest.Config(t)
			cfg.MaxConns = 8
			pool := pgtest.NewPool(t, cfg)
			storetest.Run(t, func(tb testing.TB) core.Store {
				return newStore(tb, pool, m.opts...)
			})
		})
	}
}

// TestConformanceExecModes runs the suite on pools configured the ways
// the README suggests behind PgBouncer in transaction mode: no prepared
// statements (QueryExecModeExec), or the simple protocol, where every
// result comes back as text and the claim's binary composite cannot be
// asked for.
func TestConformanceExecModes(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for _, m := range modes {
			t.Run(mode.String()+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				cfg := pgtest.Config(t)
				cfg.MaxConns = 4
				cfg.ConnConfig.DefaultQueryExecMode = mode
				pool := pgtest.NewPool(t, cfg)
				storetest.Run(t, func(tb testing.TB) core.Store {
					return newStore(tb, pool, m.opts...)
				})
			})
		}
	}
}

// TestConformanceOptimisticClaim runs the suite with WithOptimisticClaim:
// a bare insert first, the claim-or-read function only for an existing key.
func TestConformanceOptimisticClaim(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgtest.Config(t)
			cfg.MaxConns = 4
			pool := pgtest.NewPool(t, cfg)
			storetest.Run(t, func(tb testing.TB) core.Store {
				return newStore(tb, pool, append([]Option{WithOptimisticClaim()}, m.opts...)...)
			})
		})
	}
}
