package routers

import (
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/nethttpidem/nethttpidemtest"
)

// chiAdapter serves idemtest routes on a chi router, the middleware on
// each route (r.With) as nethttpidem documents for chi; the options and the
// listener are nethttpidemtest's. net/http handlers have no error to
// return (NoHandlerErrors).
var chiAdapter = idemtest.Adapter{
	Name:            "chi",
	NoHandlerErrors: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		mw, err := nethttpidem.New(eng, nethttpidemtest.Options(cfg)...)
		if err != nil {
			return "", err
		}
		r := chi.NewRouter()
		for _, rt := range routes {
			r.With(mw).Method(rt.Method, rt.Path, rt.Handler)
		}
		return nethttpidemtest.Serve(t, r, cfg), nil
	},
}

// TestChiConformance runs the adapter suite through chi on memstore,
// PostgreSQL and MariaDB.
func TestChiConformance(t *testing.T) {
	t.Run("memstore", func(t *testing.T) {
		idemtest.Run(t, chiAdapter, func(*testing.T) core.Store { return memstore.New() })
	})
	t.Run("postgres", func(t *testing.T) {
		store := postgresStore(t)
		idemtest.Run(t, chiAdapter, func(*testing.T) core.Store { return store })
	})
	t.Run("mysql", func(t *testing.T) {
		store := mysqlStore(t)
		idemtest.Run(t, chiAdapter, func(*testing.T) core.Store { return store })
	})
}
