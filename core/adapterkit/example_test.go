package adapterkit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// exchange is the smallest net/http adapter: it runs the handler under a
// Recorder for a request that owns its key, and writes what the engine
// answers otherwise.
type exchange struct {
	w    http.ResponseWriter
	r    *http.Request
	next http.Handler
	rec  *adapterkit.Recorder // set by Next for a request that owns its key
}

func (x *exchange) Next(ctx context.Context, d *adapterkit.Proceed) error {
	if d == nil { // Bypass: as if idem were absent
		x.next.ServeHTTP(x.w, x.r)
		return nil
	}
	d.RestoreBody(x.r)
	x.rec = adapterkit.NewRecorder(x.w, d.MaxResponseBytes)
	x.next.ServeHTTP(x.rec, x.r.WithContext(ctx))
	return nil
}

func (x *exchange) Captured() adapterkit.Response { return x.rec.Result() }
func (x *exchange) Send() error                   { return x.rec.Send() }
func (x *exchange) Discard() bool                 { return x.rec == nil || !x.rec.Streaming() }

func (x *exchange) Write(resp *adapterkit.Response) error {
	if x.rec != nil {
		_, err := x.rec.SendInstead(resp)
		return err
	}
	return adapterkit.WriteResponse(x.w, resp)
}

func (x *exchange) OnError(error, *adapterkit.Response) (bool, error) { return false, nil }

// An adapter translates a request into a core.Request and an Exchange and
// hands both to Engine.Serve, which runs the flow.
func Example() {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		panic(err)
	}
	if err := eng.CheckScope("example.WithScope", false); err != nil {
		panic(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "created")
	})
	mw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := core.Request{Method: r.Method, Route: "/orders", Target: r.URL.RequestURI(), Header: r.Header, Body: r.Body}
		_ = eng.Serve(r.Context(), req, &exchange{w: w, r: r, next: handler})
	})
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "order-1")
		w := httptest.NewRecorder()
		mw.ServeHTTP(w, r)
		fmt.Printf("%d %s replayed=%q\n", w.Code, w.Body.String(), w.Header().Get(core.ReplayedHeader))
	}
	// Output:
	// 201 created replayed=""
	// 201 created replayed="true"
}
