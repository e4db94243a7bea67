package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestDBRelay: through the relay every round trip costs at least the added
// time, a pipeline of statements costs it once (the relay does not
// serialize chunks), answers arrive intact, and close ends the relayed
// connection (goleak in TestMain checks the goroutines).
func TestDBRelay(t *testing.T) {
	const rtt = 40 * time.Millisecond
	up, err := dsnUpstream(pgstoretest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	relay, err := startDBRelay(up, rtt)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.close()
	dsn, err := viaRelay(pgstoretest.DSN(), relay.addr())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// Warm the connection's statement cache: one round trip per query below.
	if _, err := conn.Exec(ctx, "SELECT $1::int", 1); err != nil {
		t.Fatal(err)
	}

	const n = 5
	start := time.Now()
	for i := range n {
		var got int
		if err := conn.QueryRow(ctx, "SELECT $1::int", i).Scan(&got); err != nil || got != i {
			t.Fatalf("query %d through the relay: %d, %v", i, got, err)
		}
	}
	sequential := time.Since(start)
	if sequential < n*rtt {
		t.Errorf("%d sequential round trips took %v, want at least %v", n, sequential, n*rtt)
	}

	b := &pgx.Batch{}
	for i := range n {
		b.Queue("SELECT $1::int", i)
	}
	start = time.Now()
	br := conn.SendBatch(ctx, b)
	for i := range n {
		var got int
		if err := br.QueryRow().Scan(&got); err != nil || got != i {
			t.Fatalf("pipelined query %d: %d, %v", i, got, err)
		}
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	pipelined := time.Since(start)
	if pipelined < rtt || pipelined >= sequential {
		t.Errorf("a pipeline of %d statements took %v: want at least one round trip (%v) and less than %d sequential ones (%v)", n, pipelined, rtt, n, sequential)
	}

	relay.close()
	if err := conn.Ping(ctx); err == nil {
		t.Error("the connection still answers after the relay closed")
	}
}

func TestDBRelayNeedsURL(t *testing.T) {
	if _, err := dsnUpstream("host=127.0.0.1 user=postgres"); err == nil {
		t.Error("a key=value DSN was accepted")
	}
	if got, err := dsnUpstream("mysql://root@127.0.0.1/test"); err != nil || got != "127.0.0.1:3306" {
		t.Errorf("mysql default port: %q, %v", got, err)
	}
	if got, err := viaRelay("postgres://u@db:5433/x?sslmode=disable", "127.0.0.1:9"); err != nil || got != "postgres://u@127.0.0.1:9/x?sslmode=disable" {
		t.Errorf("viaRelay: %q, %v", got, err)
	}
}
