package nethttpidem_test

import (
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
)

func ExampleNew() {
	eng, err := core.New(memstore.New()) // pgstore.New(pool) in production
	if err != nil {
		log.Fatal(err)
	}
	// Records are keyed by (user, key): without WithScope, New fails.
	idem, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		if user := r.Header.Get("X-User-ID"); user != "" { // usually from your auth middleware
			return user, nil
		}
		return "", errors.New("unauthenticated") // answered 401
	}))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders/{id}/confirm", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// r.Context() carries the lease: core.RelayKey for the provider call.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"confirmed":true}`, r.PathValue("id"))
	})))

	// A request and its retry: the handler runs once, the retry is a replay.
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/orders/42/confirm", strings.NewReader(`{}`))
		req.Header.Set("X-User-ID", "alice")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body.String())
	}
	// Output:
	// 201  {"order":"42","confirmed":true}
	// 201 true {"order":"42","confirmed":true}
}

func ExampleNew_withoutScope() {
	eng, _ := core.New(memstore.New())
	_, err := nethttpidem.New(eng)
	fmt.Println(err != nil)
	// A single-tenant service opts in explicitly.
	shared, _ := core.New(memstore.New(), core.WithSharedKeySpace())
	_, err = nethttpidem.New(shared)
	fmt.Println(err)
	// Output:
	// true
	// <nil>
}
