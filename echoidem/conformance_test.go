package echoidem_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgtest"
)

// adapter serves the suite's routes the way an Echo app would: each route
// with the idem middleware, the neutral handler mounted by echo.WrapHandler.
var adapter = idemtest.Adapter{
	Name: "echo",
	Serve: func(t *testing.T, eng *core.Engine, routes []idemtest.Route) string {
		e := echo.New()
		e.HideBanner, e.HidePort = true, true
		mw := echoidem.Middleware(eng, echoidem.WithScope(func(c echo.Context) (string, error) {
			return c.Request().Header.Get(idemtest.ScopeHeader), nil
		}))
		for _, rt := range routes {
			e.Add(rt.Method, rt.Path, echo.WrapHandler(rt.Handler), mw)
		}
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		return srv.URL
	},
}

func TestConformance(t *testing.T) {
	idemtest.Run(t, adapter, func(*testing.T) core.Store { return memstore.New() })
}

// TestConformancePostgres runs the suite on pgstore in a schema of its own;
// scenarios use unique keys and tenants, so they share one store.
func TestConformancePostgres(t *testing.T) {
	store, _ := newPGStore(t)
	idemtest.Run(t, adapter, func(*testing.T) core.Store { return store })
}

// newPGStore migrates a fresh schema on the test database (pgtest) and
// returns a store on it and the schema name; everything is dropped when t
// ends.
func newPGStore(t *testing.T) (*pgstore.Store, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgstore.Migrate(ctx, pool, pgstore.WithSchema(schema)); err != nil {
		t.Fatalf("pgstore.Migrate: %v", err)
	}
	store, err := pgstore.New(pool, pgstore.WithSchema(schema))
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	return store, schema
}
