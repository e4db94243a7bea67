// Package nethttpidem_test runs the idemtest conformance suite for
// nethttpidem on the database stores (pgstore, mysqlstore, sqlitestore),
// whose drivers the root module does not require. Every other test of the
// net/http adapter, the suite on memstore included, lives beside the code
// in nethttpidem.
package nethttpidem_test

import (
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/nethttpidem"
)

// adapter serves idemtest routes on an http.ServeMux, each handler wrapped
// in the middleware, so r.Pattern gives the route template. net/http
// handlers have no error to return (NoHandlerErrors).
//
// It is a copy of the adapter in nethttpidem/conformance_test.go (test
// files cannot be imported); keep the two in step.
var adapter = idemtest.Adapter{
	Name:            "nethttp",
	NoHandlerErrors: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		mw, err := nethttpidem.New(eng, suiteOptions(cfg)...)
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

// suiteOptions are the middleware options a suite configuration asks for.
func suiteOptions(cfg idemtest.Config) []nethttpidem.Option {
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
	return opts
}
