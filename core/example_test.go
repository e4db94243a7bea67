package core_test

import (
	"context"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// A job runner (no HTTP framework) uses the engine directly: Decide, then
// map the outcome by its problem name, run the work for Proceed and record
// its result with Commit. Retries of the same job replay the recorded
// result; the work runs once.
func Example() {
	eng, err := core.New(memstore.New()) // pgstore.New(pool) in production
	if err != nil {
		panic(err)
	}
	runs := 0
	handle := func(ctx context.Context, tenant, key, payload string) (int, string) {
		d, err := eng.Decide(ctx, core.Request{
			Method: http.MethodPost, Route: "/jobs/{kind}", Target: "/jobs/invoice",
			Scope:  tenant, // records are per tenant: without a scope the engine answers 401
			Header: http.Header{"Idempotency-Key": {key}},
			Body:   strings.NewReader(payload),
		})
		if err != nil { // the store is down: nothing ran
			return d.Response.Status, d.Problem
		}
		switch d.Outcome {
		case core.Replay:
			return d.Response.Status, string(d.Response.Body) + " (replayed)"
		case core.Reject:
			info, _ := problem.Lookup(d.Problem) // no JSON parsing needed
			return info.Status, d.Problem
		}
		runs++
		result := fmt.Sprintf("invoice %d sent", runs)
		if err := eng.Commit(d.Context(ctx), d, adapterkit.Response{Status: http.StatusCreated, Body: []byte(result)}); err != nil {
			return http.StatusServiceUnavailable, problem.StoreUnavailable
		}
		return http.StatusCreated, result
	}
	ctx := context.Background()
	fmt.Println(handle(ctx, "acme", "job-7", `{"customer":42}`))
	fmt.Println(handle(ctx, "acme", "job-7", `{"customer":42}`))
	fmt.Println(handle(ctx, "acme", "job-7", `{"customer":43}`))
	fmt.Println(handle(ctx, "", "job-8", `{"customer":42}`))
	// Output:
	// 201 invoice 1 sent
	// 201 invoice 1 sent (replayed)
	// 422 payload-mismatch
	// 401 scope-unavailable
}
