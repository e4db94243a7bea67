package routers_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
)

type userKey struct{}

// authenticate stands for the app's authentication middleware: it puts
// the user in the request context, where the scope function finds it.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if user := r.Header.Get("X-User-ID"); user != "" {
			ctx = context.WithValue(ctx, userKey{}, user)
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func confirmOrder(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%q,"status":"confirmed"}`+"\n", chi.URLParam(r, "id"))
}

// Example_chi mounts idem on chi routes: chi has routed when the
// middleware runs (r.With, or r.Use inside r.Group), so the route recorded
// is chi's pattern and paths chi does not serve never reach idem.
func Example_chi() {
	eng, err := core.New(memstore.New()) // pgstore.New(pool) in production
	if err != nil {
		log.Fatal(err)
	}
	idem, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		if user, ok := r.Context().Value(userKey{}).(string); ok {
			return user, nil
		}
		return "", errors.New("unauthenticated") // answered 401
	}))
	if err != nil {
		log.Fatal(err)
	}
	r := chi.NewRouter()
	r.Use(authenticate)
	r.Group(func(r chi.Router) {
		r.Use(idem)
		r.Post("/v1/orders/{id}/confirm", confirmOrder)
	})

	// A request and its retry: the handler runs once, the retry is a replay.
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/orders/42/confirm", strings.NewReader(`{}`))
		req.Header.Set("X-User-ID", "alice")
		req.Header.Set("Idempotency-Key", "0b6c3f5e-8f39-4a43-9d2a-7f0e4a1d2c11")
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), strings.TrimSpace(rec.Body.String()))
	}
	// Output:
	// 201  {"order":"42","status":"confirmed"}
	// 201 true {"order":"42","status":"confirmed"}
}
