package memstore_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// A first request claims the key, runs, and completes it; its retry is
// answered from the stored response without running again.
func Example() {
	ctx := context.Background()
	s := memstore.New(memstore.WithMaxEntries(100_000))

	req := storekit.ClaimRequest{
		Scope:       "user-42",
		Key:         "8e03978e-40d5-43e8-bc93-6894a57f9324",
		Method:      http.MethodPost,
		Route:       "/v1/payments",
		Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", // the engine's hex SHA-256 of the request
		Lease:       30 * time.Second,
		Retention:   24 * time.Hour,
	}

	first, err := s.Claim(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first claimed:", first.Claimed)

	// ... the handler runs under first.Record.Token ...
	f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: first.Record.Token}
	if err := s.Complete(ctx, f, storekit.StoredResponse{Status: http.StatusCreated, Body: []byte(`{"id":"pay_1"}`)}); err != nil {
		fmt.Println(err)
		return
	}

	retry, err := s.Claim(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("retry claimed:", retry.Claimed)
	fmt.Println("replay:", retry.Record.Response.Status, string(retry.Record.Response.Body))
	// Output:
	// first claimed: true
	// retry claimed: false
	// replay: 201 {"id":"pay_1"}
}
