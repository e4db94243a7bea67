package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

var benchRun atomic.Int64

// BenchmarkClaimComplete measures claim+complete pairs per second (fresh
// key each time: the cost of a first request) at 1, 16 and 64 concurrent
// workers, each worker on its own pool connection, next to:
//
//   - raw: the store's own two statements sent by a plain pgx loop (what the
//     store adds on top: argument encoding, scanning, header JSON);
//   - simple: the simplest statements that could do the job, a plain INSERT
//     and a fenced UPDATE (what the claim-or-read CTE costs over them).
//
// Each pair costs two commits; on a server with synchronous_commit=on the
// numbers are bounded by WAL flush latency at low concurrency and by group
// commit at high concurrency.
func BenchmarkClaimComplete(b *testing.B) {
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			for _, workers := range []int{1, 16, 64} {
				cfg := pgstoretest.Config(b)
				cfg.MaxConns = int32(workers)
				cfg.MinConns = int32(workers)
				pool := pgstoretest.NewPool(b, cfg)
				s := newStore(b, pool, m.opts...)
				simpleTable := createSimpleTable(b, s)
				resp := storekit.StoredResponse{
					Status: 201,
					Header: map[string][]string{"Content-Type": {"application/json"}},
					Body:   []byte(`{"id":"pay_123","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`),
				}
				header := []byte(`{"Content-Type":["application/json"]}`)
				lease, retention := micros(30*time.Second), micros(24*time.Hour)

				b.Run(fmt.Sprintf("store/workers=%d", workers), func(b *testing.B) {
					runPairs(b, workers, func(ctx context.Context, key string) error {
						req := claimReq(key, 30*time.Second)
						req.Retention = 24 * time.Hour
						res, err := s.Claim(ctx, req)
						if err != nil {
							return err
						}
						if !res.Claimed {
							return fmt.Errorf("not claimed")
						}
						return s.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: key, Token: res.Record.Token}, resp)
					})
				})
				b.Run(fmt.Sprintf("raw/workers=%d", workers), func(b *testing.B) {
					runPairs(b, workers, func(ctx context.Context, key string) error {
						var (
							tok     int64
							claimed bool
						)
						rows, err := pool.Query(ctx, s.sql.claim, "tenant", key, "POST", "/v1/payments", "f00d", lease, retention)
						if err != nil {
							return err
						}
						for rows.Next() {
							vals, err := rows.Values()
							if err != nil {
								return err
							}
							tok, claimed = vals[6].(int64), vals[15].(bool)
						}
						if err := rows.Err(); err != nil {
							return err
						}
						if !claimed {
							return fmt.Errorf("not claimed")
						}
						tag, err := pool.Exec(ctx, s.sql.complete, "tenant", key, tok, int32(201), header, resp.Body, false)
						if err != nil {
							return err
						}
						if tag.RowsAffected() != 1 {
							return fmt.Errorf("complete matched %d rows", tag.RowsAffected())
						}
						return nil
					})
				})
				b.Run(fmt.Sprintf("simple/workers=%d", workers), func(b *testing.B) {
					ins := `INSERT INTO ` + simpleTable + ` (scope, key, token, status, locked_until, expires_at)
VALUES ($1, $2, nextval('` + s.names.seq + `'), 'processing', now() + $3::bigint * interval '1 microsecond',
        now() + $4::bigint * interval '1 microsecond') RETURNING token`
					upd := `UPDATE ` + simpleTable + ` SET status = 'completed', resp_status = $4, resp_header = $5, resp_body = $6
WHERE scope = $1 AND key = $2 AND token = $3 AND status = 'processing'`
					runPairs(b, workers, func(ctx context.Context, key string) error {
						var tok int64
						if err := pool.QueryRow(ctx, ins, "tenant", key, lease, retention).Scan(&tok); err != nil {
							return err
						}
						tag, err := pool.Exec(ctx, upd, "tenant", key, tok, int32(201), header, resp.Body)
						if err != nil {
							return err
						}
						if tag.RowsAffected() != 1 {
							return fmt.Errorf("update matched %d rows", tag.RowsAffected())
						}
						return nil
					})
				})
			}
		})
	}
}

func createSimpleTable(tb testing.TB, s *Store) string {
	tb.Helper()
	name := s.names.schema + `."simple_records"`
	_, err := s.pool.Exec(context.Background(), `CREATE TABLE `+name+` (
  scope text NOT NULL, key text NOT NULL, token bigint NOT NULL, status text NOT NULL,
  locked_until timestamptz NOT NULL, expires_at timestamptz NOT NULL,
  resp_status integer, resp_header jsonb, resp_body bytea,
  PRIMARY KEY (scope, key))`)
	if err != nil {
		tb.Fatalf("create simple table: %v", err)
	}
	return name
}

// runPairs runs b.N calls of pair, spread over workers goroutines, each with
// a unique key, and reports pairs/s.
func runPairs(b *testing.B, workers int, pair func(ctx context.Context, key string) error) {
	prefix := "b" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
	ctx := context.Background()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := pair(ctx, prefix+strconv.FormatInt(i, 10)); err != nil {
					b.Error(err) // not Fatal: not the benchmark goroutine
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
}

// BenchmarkConformance runs the store-neutral benchmark of core/storetest.
func BenchmarkConformance(b *testing.B) {
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			cfg := pgstoretest.Config(b)
			cfg.MaxConns = 16
			pool := pgstoretest.NewPool(b, cfg)
			storetest.Benchmark(b, func(tb testing.TB) core.Store { return newStore(tb, pool, m.opts...) })
		})
	}
	b.Run("plain-function-first", func(b *testing.B) {
		cfg := pgstoretest.Config(b)
		cfg.MaxConns = 16
		pool := pgstoretest.NewPool(b, cfg)
		storetest.Benchmark(b, func(tb testing.TB) core.Store { return newStore(tb, pool, withFunctionFirst()) })
	})
}
