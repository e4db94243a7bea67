package sqlitestore_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/sqlitestore"
)

// A service on one host keeps its idempotency keys in a SQLite file, and
// books its ledger row in the transaction idem commits with the response.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)

	db, err := sqlitestore.OpenDB(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	if err := sqlitestore.Migrate(ctx, db); err != nil {
		fmt.Println(err)
		return
	}
	store, err := sqlitestore.New(db)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER)"); err != nil {
		fmt.Println(err)
		return
	}
	eng, err := core.New(store)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Each user's keys are their own (the scope).
	mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		return r.Header.Get("X-User-ID"), nil
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	pay := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := sqlitestore.Tx(r.Context()) // committed by idem with the response
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO payments (id, amount) VALUES ('p1', 1000)"); err != nil {
			http.Error(w, "ledger", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	_ = pay // mount it: mux.Handle("POST /v1/payments", pay)
	fmt.Println("ready")
	// Output: ready
}
