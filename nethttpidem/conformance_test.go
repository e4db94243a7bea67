package nethttpidem_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
)

// adapter serves idemtest routes on an http.ServeMux, each handler wrapped
// in the middleware, so r.Pattern gives the route template.
var adapter = idemtest.Adapter{
	Name: "nethttp",
	Serve: func(t *testing.T, eng *core.Engine, routes []idemtest.Route) string {
		mw := mw(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
			return r.Header.Get(idemtest.ScopeHeader), nil
		}))
		mux := http.NewServeMux()
		for _, rt := range routes {
			mux.Handle(rt.Method+" "+rt.Path, mw(rt.Handler))
		}
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv.URL
	},
}

func newMemstore(*testing.T) core.Store { return memstore.New() }

func TestConformance(t *testing.T) {
	idemtest.Run(t, adapter, newMemstore)
}
