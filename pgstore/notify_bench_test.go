package pgstore

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// BenchmarkNotifyCost measures what a pg_notify in the completing
// statement would cost the claim+complete path — the obvious way to wake
// waiters with LISTEN/NOTIFY. It runs the floor's two statements (see
// BenchmarkFloor) with and without a pg_notify in the UPDATE, alternating
// rounds, and reports the median paired throughput ratio. PostgreSQL
// serializes the commits of transactions that sent a notification (they
// take a database-wide lock held through commit), which defeats group
// commit: the ratio falls with the number of workers. No one listens
// during the benchmark; the cost is paid regardless.
func BenchmarkNotifyCost(b *testing.B) {
	for _, workers := range []int{1, 16} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
			cfg := pgstoretest.Config(b)
			cfg.MaxConns = int32(workers)
			cfg.MinConns = int32(workers)
			pool := pgstoretest.NewPool(b, cfg)
			s := newStore(b, pool)
			ctx := context.Background()
			table := s.names.schema + `."notify_floor"`
			if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
  scope text NOT NULL, key text NOT NULL, token bigint NOT NULL, status text NOT NULL,
  locked_until timestamptz NOT NULL, expires_at timestamptz NOT NULL,
  resp_status integer, resp_header jsonb, resp_body bytea,
  PRIMARY KEY (scope, key))`); err != nil {
				b.Fatal(err)
			}
			ins := `INSERT INTO ` + table + ` (scope, key, token, status, locked_until, expires_at)
VALUES ($1, $2, nextval('` + s.names.seq + `'), 'processing', now() + interval '30 seconds', now() + interval '1 day') RETURNING token`
			set := ` SET status = 'completed', resp_status = 201, resp_body = $4
WHERE scope = $1 AND key = $2 AND token = $3 AND status = 'processing'`
			upd := `UPDATE ` + table + set
			updNotify := `WITH u AS (UPDATE ` + table + set + ` RETURNING scope, key)
SELECT pg_notify('idem_bench', md5(octet_length(scope)::text || ':' || scope || key)) FROM u`
			body := []byte(`{"id":"pay_123","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`)
			pairOn := func(upd string) func(context.Context, string) error {
				return func(ctx context.Context, key string) error {
					var tok int64
					if err := pool.QueryRow(ctx, ins, "tenant", key).Scan(&tok); err != nil {
						return err
					}
					_, err := pool.Exec(ctx, upd, "tenant", key, tok, body)
					return err
				}
			}
			plain, notify := pairOn(upd), pairOn(updNotify)
			keys := newKeySource(true, "")
			for _, p := range []func(context.Context, string) error{plain, notify} {
				if err := runRound(ctx, workers, 4*workers, keys, p); err != nil {
					b.Fatal(err)
				}
			}
			round := max(8*workers, 100)
			var ratios []float64
			b.ResetTimer()
			for done := 0; done < b.N; done += round {
				n := min(round, b.N-done)
				t0 := time.Now()
				if err := runRound(ctx, workers, n, keys, plain); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := runRound(ctx, workers, n, keys, notify); err != nil {
					b.Fatal(err)
				}
				ratios = append(ratios, t1.Sub(t0).Seconds()/time.Since(t1).Seconds())
			}
			b.StopTimer()
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "notify/plain")
		})
	}
}
