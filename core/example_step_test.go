package core_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// A handler whose booking fails after the charge: the retry resumes after
// the charge step, and the provider is called once.
func ExampleStep() {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace(), core.WithStepsRequired(true))
	if err != nil {
		panic(err)
	}
	calls := 0
	handler := func(ctx context.Context, bookingWorks bool) adapterkit.Response {
		charge, err := core.StepJSON(ctx, "charge", func(ctx context.Context) (string, error) {
			calls++ // the provider call, with core.RelayKey(ctx, "charge") as its key
			return "ch_1", nil
		})
		if err != nil || !bookingWorks {
			return adapterkit.Response{Status: http.StatusServiceUnavailable} // retryable
		}
		return adapterkit.Response{Status: http.StatusCreated, Body: []byte(charge)}
	}
	for _, bookingWorks := range []bool{false, true} {
		ctx := context.Background()
		d, err := eng.Decide(ctx, core.Request{Method: http.MethodPost, Route: "/v1/payments", Target: "/v1/payments",
			Header: http.Header{"Idempotency-Key": {"k1"}}, Body: strings.NewReader(`{"amount":1000}`)})
		if err != nil || d.Outcome != core.Proceed {
			panic(fmt.Sprint(d.Outcome, err))
		}
		resp := handler(d.Context(ctx), bookingWorks)
		if err := eng.Commit(ctx, d, resp); err != nil {
			panic(err)
		}
		fmt.Println(resp.Status, string(resp.Body), "provider calls:", calls)
	}
	// Output:
	// 503  provider calls: 1
	// 201 ch_1 provider calls: 1
}
