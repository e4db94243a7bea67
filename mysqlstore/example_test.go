package mysqlstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// Example wires mysqlstore into an engine in transactional mode: the
// handler writes its ledger row in mysqlstore.Tx, and the engine's Commit
// stores the response in the same transaction. A retry with the same key
// replays.
func Example() {
	ctx := context.Background()
	// A database of its own, dropped at the end.
	cfg, err := mysql.ParseDSN(mysqlstoretest.DSN())
	if err != nil {
		log.Fatal(err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	cfg.DBName = "idem_example_" + hex.EncodeToString([]byte(rand.Text()[:8]))
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+cfg.DBName+"`"); err != nil {
		log.Fatal(err)
	}
	defer func() { _, _ = admin.ExecContext(ctx, "DROP DATABASE `"+cfg.DBName+"`") }()

	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8) // keep connections, and the statements prepared on them

	// At start-up, from every instance: idempotent and concurrency-safe.
	if err := mysqlstore.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	store, err := mysqlstore.New(db)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount INT NOT NULL)`); err != nil {
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
			// The handler: business write in the lease's transaction, no Commit.
			tx, err := mysqlstore.Tx(hctx)
			if err != nil {
				_ = eng.Abort(ctx, d, err)
				return
			}
			if _, err := tx.ExecContext(hctx, `INSERT INTO ledger (amount) VALUES (1000)`); err != nil {
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
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", rows)
	// Output:
	// executed: 201
	// replay: 201 {"status":"paid"}
	// ledger rows: 1
}
