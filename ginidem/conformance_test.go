package ginidem_test

import (
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// adapter mounts each idemtest route natively: the middleware, then the
// neutral handler through gin.WrapH.
var adapter = idemtest.Adapter{
	Name: "gin",
	Serve: func(t *testing.T, eng *core.Engine, routes []idemtest.Route) string {
		r := gin.New()
		mw := mw(eng, ginidem.WithScope(func(c *gin.Context) (string, error) {
			return c.GetHeader(idemtest.ScopeHeader), nil
		}))
		for _, rt := range routes {
			r.Handle(rt.Method, rt.Path, mw, gin.WrapH(rt.Handler))
		}
		srv := httptest.NewServer(r)
		t.Cleanup(srv.Close)
		return srv.URL
	},
}

func TestConformance(t *testing.T) {
	idemtest.Run(t, adapter, func(*testing.T) core.Store { return memstore.New() })
}

// TestConformancePostgres runs the suite on pgstore, in a schema of its own
// (pgtest). Scenarios use unique keys and tenants, so they share one store.
func TestConformancePostgres(t *testing.T) {
	store, _ := pgstoretest.Store(t)
	idemtest.Run(t, adapter, func(*testing.T) core.Store { return store })
}
