package pgstore

import (
	"testing"

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
