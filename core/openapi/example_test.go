package openapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/openapi"
)

// A service publishes the policy its engine runs with in its own OpenAPI
// description: Protect marks each operation idem guards (the key
// parameter, idem's problem responses, the replay marker on the responses
// that are replayed), and AddTo merges the components and x-idempotency
// into the document.
func Example() {
	eng, err := core.New(memstore.New(), core.WithRetention(48*time.Hour))
	if err != nil {
		panic(err)
	}
	createPayment := map[string]any{
		"operationId": "createPayment",
		"responses": map[string]any{
			"201": map[string]any{"description": "The payment."},
		},
	}
	doc := map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": "payments", "version": "1.0.0"},
		"paths":   map[string]any{"/v1/payments": map[string]any{"post": createPayment}},
	}

	frag := openapi.New(eng.Policy())
	fmt.Println(frag.Protect(http.MethodPost, createPayment))
	fmt.Println(frag.Protect(http.MethodGet, map[string]any{})) // GET is not protected
	frag.AddTo(doc)

	created := createPayment["responses"].(map[string]any)["201"]
	b, _ := json.Marshal(created)
	fmt.Println(string(b))
	fmt.Println(doc["x-idempotency"].(map[string]any)["retention"])
	// Output:
	// true
	// false
	// {"description":"The payment.","headers":{"Idempotent-Replayed":{"$ref":"#/components/headers/IdemReplayed"}}}
	// PT48H
}
