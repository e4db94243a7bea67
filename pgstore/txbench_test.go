package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// BenchmarkTxFirstExecution: a first execution in transactional mode with
// one business write through Tx (claim; BEGIN, the write; the fenced
// complete with COMMIT), on a fresh key each time, at 16 workers. It
// reports pairs/s and, on Linux with the server on this machine, the CPU of
// every PostgreSQL process per pair (server-ns/pair) and of the test
// process (client-ns/pair): BEGIN's round trip also takes the
// transaction's id (txid_current), which is what this measures.
func BenchmarkTxFirstExecution(b *testing.B) {
	const workers = 16
	cfg := pgstoretest.Config(b)
	cfg.MaxConns, cfg.MinConns = 2*workers, 2*workers
	pool := pgstoretest.NewPool(b, cfg)
	s := newStore(b, pool, WithTransactional())
	table := pgx.Identifier{s.cfg.schema, "bench_ledger"}.Sanitize()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+table+" (key text PRIMARY KEY, token bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	resp := storekit.StoredResponse{Status: 201, Body: []byte(`{"id":"pay_123"}`)}
	server0, err := serverCPU()
	if err != nil {
		b.Skipf("server CPU time not readable: %v", err)
	}
	client0 := processCPU()
	runPairs(b, workers, func(ctx context.Context, key string) error {
		req := claimReq(key, 30*time.Second)
		res, err := s.Claim(ctx, req)
		if err != nil {
			return err
		}
		if !res.Claimed {
			return fmt.Errorf("not claimed")
		}
		f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
		lctx := storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
		tx, err := Tx(lctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(lctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, f.Token); err != nil {
			return err
		}
		return s.Complete(lctx, f, resp)
	})
	server1, _ := serverCPU()
	b.ReportMetric(float64((server1-server0).Nanoseconds())/float64(b.N), "server-ns/pair")
	b.ReportMetric(float64((processCPU()-client0).Nanoseconds())/float64(b.N), "client-ns/pair")
}
