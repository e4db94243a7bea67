package sqlitestore_test

import (
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/sqlitestore/sqlitestoretest"
)

// nethttpAdapter serves idemtest routes through nethttpidem, as
// nethttpidem's own conformance test does (the other adapters' runs on
// sqlitestore belong with them).
var nethttpAdapter = idemtest.Adapter{
	Name:            "nethttp",
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
		mux := http.NewServeMux()
		for _, rt := range routes {
			mux.Handle(rt.Method+" "+rt.Path, mw(rt.Handler))
		}
		srv := httptest.NewUnstartedServer(mux)
		if cfg.Log != nil {
			srv.Config.ErrorLog = log.New(cfg.Log, "", 0)
		}
		srv.Start()
		t.Cleanup(srv.Close)
		return srv.URL, nil
	},
}

// TestIdemtestNetHTTP runs the adapter suite on sqlitestore; scenarios
// use unique keys and tenants, so they share one store.
func TestIdemtestNetHTTP(t *testing.T) {
	store := sqlitestoretest.Store(t)
	idemtest.Run(t, nethttpAdapter, func(*testing.T) core.Store { return store })
}
