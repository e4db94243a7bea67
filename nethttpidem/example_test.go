package nethttpidem_test

import (
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
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

// Step one of a staged roll-out: keys optional, so clients that send none
// keep working (unprotected), while the observer counts them. otelidem
// reports the same count as idem.decisions{idem.outcome="bypass",
// idem.problem="missing-key"}. When it reaches zero, drop
// WithKeyRequired(false): from then on a POST without a key gets 400.
func ExampleNew_stagedRollout() {
	var withoutKey, withKey int
	eng, err := core.New(memstore.New(),
		core.WithKeyRequired(false),
		core.WithObserver(func(ev core.Event) { // otelidem's tel.Observer() in production
			switch {
			case ev.Kind == core.EventBypass && ev.Problem == problem.MissingKey:
				withoutKey++
			case ev.Kind == core.EventClaim || ev.Kind == core.EventReplay:
				withKey++
			}
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	idem, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		return r.Header.Get("X-User-ID"), nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))

	for _, key := range []string{"", "k-1", ""} {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
		req.Header.Set("X-User-ID", "alice")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(rec.Code)
	}
	fmt.Println("without a key:", withoutKey, "with a key:", withKey)
	// Output:
	// 201
	// 201
	// 201
	// without a key: 2 with a key: 1
}
