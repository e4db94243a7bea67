package routers

import (
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
)

// chiAdapter serves idemtest routes on a chi router, the middleware on
// each route (r.With) as nethttpidem documents for chi. net/http handlers
// have no error to return (NoHandlerErrors).
var chiAdapter = idemtest.Adapter{
	Name:            "chi",
	NoHandlerErrors: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		var opts []nethttpidem.Option
		if cfg.NilOptions {
			opts = append(opts, nil, nethttpidem.WithScope(nil), nethttpidem.WithSkip(nil),
				nethttpidem.WithRoute(nil), nethttpidem.WithErrorHandler(nil))
		}
		if !cfg.NoScope {
			opts = append(opts, nethttpidem.WithScope(func(r *http.Request) (string, error) {
				if cfg.ScopeErr != nil {
					return "", cfg.ScopeErr
				}
				return r.Header.Get(idemtest.ScopeHeader), nil
			}))
		}
		if cfg.SilentErrorHandler || cfg.ErrorHandlerSaw != nil {
			opts = append(opts, nethttpidem.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error, fallback *adapterkit.Response) {
				if cfg.ErrorHandlerSaw != nil {
					cfg.ErrorHandlerSaw(err)
				}
				if !cfg.SilentErrorHandler {
					_ = adapterkit.WriteResponse(w, fallback)
				}
			}))
		}
		mw, err := nethttpidem.New(eng, opts...)
		if err != nil {
			return "", err
		}
		r := chi.NewRouter()
		for _, rt := range routes {
			r.With(mw).Method(rt.Method, rt.Path, rt.Handler)
		}
		srv := httptest.NewUnstartedServer(r)
		if cfg.Log != nil {
			srv.Config.ErrorLog = log.New(cfg.Log, "", 0)
		}
		srv.Start()
		t.Cleanup(srv.Close)
		return srv.URL, nil
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
