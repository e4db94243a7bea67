package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// Example wires pgstore into an engine in transactional mode: the handler
// writes its ledger row in pgstore.Tx, and the engine's Commit stores the
// response in the same transaction. A retry with the same key replays.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgstoretest.DSN())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := pgstore.WithSchema("idem_example")
	_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS idem_example CASCADE") // a previous run's leftovers
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS idem_example CASCADE") }()

	// At start-up, from every instance: idempotent and concurrency-safe.
	if err := pgstore.Migrate(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(pool, schema)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // at shutdown: its LISTEN connection, if anyone waits (optional)
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS idem_example.ledger (id bigserial PRIMARY KEY, amount int NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	eng, err := core.New(store, core.WithLease(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}

	// What an adapter does for each request.
	serve := func(key string) {
		d, err := eng.Decide(ctx, core.Request{
			Method: http.MethodPost, Route: "/v1/payments", Scope: "user-1",
			Header: http.Header{"Idempotency-Key": {key}},
			Body:   bytes.NewReader([]byte(`{"amount":1000}`)),
		})
		if err != nil {
			log.Fatal(err)
		}
		switch d.Outcome {
		case core.Proceed:
			hctx := d.Context(ctx)
			// The handler: business write in the lease's transaction.
			tx, err := pgstore.Tx(hctx)
			if err != nil {
				_ = eng.Abort(ctx, d, err)
				return
			}
			var id int64
			if err := tx.QueryRow(hctx, `INSERT INTO idem_example.ledger (amount) VALUES (1000) RETURNING id`).Scan(&id); err != nil {
				_ = eng.Abort(ctx, d, err)
				return
			}
			// Commit: fenced update of the record + COMMIT of the ledger row.
			if err := eng.Commit(ctx, d, adapterkit.Response{Status: 201, Body: []byte(`{"status":"paid"}`)}); err != nil {
				log.Fatal(err)
			}
			fmt.Println("executed: 201")
		case core.Replay, core.Reject:
			fmt.Printf("%s: %d %s\n", d.Outcome, d.Response.Status, d.Response.Body)
		}
	}
	serve(`"order-42"`)
	serve(`"order-42"`) // the client's retry

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_example.ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", rows)
	// Output:
	// executed: 201
	// replay: 201 {"status":"paid"}
	// ledger rows: 1
}
