package sqlitestore_test

import (
	"context"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/sqlitestore"
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
			opts = append(opts, nethttpidem.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error, fallback *core.Response) {
				if cfg.ErrorHandlerSaw != nil {
					cfg.ErrorHandlerSaw(err)
				}
				if !cfg.SilentErrorHandler {
					_ = core.WriteResponse(w, fallback)
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

// testStore is a migrated store on a fresh file in tb's temporary
// directory (exported kits for other modules' tests: see the README).
func testStore(tb testing.TB) *sqlitestore.Store {
	tb.Helper()
	db, err := sqlitestore.OpenDB(context.Background(), filepath.Join(tb.TempDir(), "idem.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	if err := sqlitestore.Migrate(context.Background(), db); err != nil {
		tb.Fatal(err)
	}
	s, err := sqlitestore.New(db)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// TestIdemtestNetHTTP runs the adapter suite on sqlitestore; scenarios
// use unique keys and tenants, so they share one store.
func TestIdemtestNetHTTP(t *testing.T) {
	store := testStore(t)
	idemtest.Run(t, nethttpAdapter, func(*testing.T) core.Store { return store })
}
