package core_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// A queue consumer charges each payment once, however often its message
// is delivered: the message's payment ID is the key.
func ExampleEngine_Call() {
	e, _ := core.New(memstore.New())
	consume := func(paymentID string, payload []byte) {
		res, err := e.Call(context.Background(),
			core.CallRequest{Scope: "payments", Key: paymentID, Name: "charge", Input: payload},
			func(ctx context.Context) ([]byte, error) {
				// Charge with core.RelayKey(ctx, "provider") as the provider's key.
				return []byte("ch_1"), nil
			})
		switch {
		case errors.Is(err, core.ErrInFlight):
			fmt.Println("in flight elsewhere: leave the message for redelivery")
		case err != nil:
			fmt.Println("failed:", err)
		default:
			fmt.Printf("charge %s (replayed: %v)\n", res.Value, res.Replayed)
		}
	}
	consume("pay-1", []byte(`{"amount":100}`))
	consume("pay-1", []byte(`{"amount":100}`)) // redelivered
	consume("pay-1", []byte(`{"amount":999}`)) // the ID reused for another payment
	// Output:
	// charge ch_1 (replayed: false)
	// charge ch_1 (replayed: true)
	// failed: idem: call: Idempotency key reused with a different request
}

func ExampleCallJSON() {
	e, _ := core.New(memstore.New())
	type receipt struct{ ChargeID string }
	req := core.CallRequest{Scope: "jobs", Key: "nightly-2026-12-03", Name: "settle"}
	for range 2 {
		r, err := core.CallJSON(context.Background(), e, req, func(context.Context) (receipt, error) {
			fmt.Println("settling")
			return receipt{ChargeID: "st_1"}, nil
		})
		fmt.Println(r.ChargeID, err)
	}
	// Output:
	// settling
	// st_1 <nil>
	// st_1 <nil>
}
