package echoidem_test

import (
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// adapter serves the suite's routes the way an Echo app would: each route
// with the idem middleware, the neutral handler mounted by echo.WrapHandler.
var adapter = idemtest.Adapter{
	Name: "echo",
	Serve: func(t *testing.T, eng *core.Engine, routes []idemtest.Route) string {
		e := echo.New()
		e.HideBanner, e.HidePort = true, true
		mw := mw(eng, echoidem.WithScope(func(c echo.Context) (string, error) {
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
	store, _ := pgstoretest.Store(t)
	idemtest.Run(t, adapter, func(*testing.T) core.Store { return store })
}
