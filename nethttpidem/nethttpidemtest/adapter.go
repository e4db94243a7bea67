package nethttpidemtest

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

// Adapter serves idemtest routes on an http.ServeMux, each handler wrapped
// in the middleware, so r.Pattern gives the route template. net/http
// handlers have no error to return (NoHandlerErrors).
var Adapter = idemtest.Adapter{
	Name:            "nethttp",
	NoHandlerErrors: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		mw, err := nethttpidem.New(eng, Options(cfg)...)
		if err != nil {
			return "", err
		}
		mux := http.NewServeMux()
		for _, rt := range routes {
			mux.Handle(rt.Method+" "+rt.Path, mw(rt.Handler))
		}
		return Serve(t, mux, cfg), nil
	},
}

// Options are the middleware options a suite configuration asks for: the
// scope from idemtest.ScopeHeader (or cfg.ScopeErr), the error handler
// cfg asks to see or silence, and nil options (cfg.NilOptions).
func Options(cfg idemtest.Config) []nethttpidem.Option {
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

// Serve serves h on a real listener, the server's error log into cfg.Log
// when set, closed when the test ends, and returns its base URL.
func Serve(t *testing.T, h http.Handler, cfg idemtest.Config) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	if cfg.Log != nil {
		srv.Config.ErrorLog = log.New(cfg.Log, "", 0)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}
