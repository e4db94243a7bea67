package pgstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/pgstore/pgtest"
)

// BenchmarkFloor measures the store's claim+complete (a first execution:
// fresh key, claim, store the response) against the floor: the two
// simplest statements that could do the job, sent with pgx on the same
// pool —
//
//	INSERT INTO t (scope, key, token, status, locked_until, expires_at)
//	VALUES (..., nextval(seq), 'processing', ...) RETURNING token
//	UPDATE t SET status = 'completed', resp_* = ...
//	WHERE scope = $1 AND key = $2 AND token = $3 AND status = 'processing'
//
// on a table with only the primary key. Each is one round trip and one
// commit, as the store's are. A third variant, floor+idx, runs the same
// statements on a copy of that table with a B-tree index on expires_at, as
// the store's table has for its sweeper: the difference between floor and
// floor+idx is what retention's index costs, whoever runs the statements.
//
// The machine this runs on is shared and noisy, so the variants are not
// run one after the other for seconds each: they alternate (store, floor,
// floor+idx) in rounds of 8 pairs per worker (at least 100), and each
// reported ratio is the median over rounds of the store's throughput over
// the other's in adjacent rounds, which cancels most of the drift. Also
// reported: each variant's overall pairs/s. b.N is the number of pairs
// each variant runs; use a fixed count, e.g. -benchtime 2000x.
func BenchmarkFloor(b *testing.B) {
	for _, m := range modes {
		for _, workers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/workers=%d", m.name, workers), func(b *testing.B) {
				benchFloor(b, workers, m.opts)
			})
		}
	}
}

func benchFloor(b *testing.B, workers int, opts []Option) {
	cfg := pgtest.Config(b)
	cfg.MaxConns = int32(workers)
	cfg.MinConns = int32(workers)
	pool := pgtest.NewPool(b, cfg)
	s := newStore(b, pool, opts...)
	ctx := context.Background()

	table := s.names.schema + `."floor_records"`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
  scope text NOT NULL, key text NOT NULL, token bigint NOT NULL, status text NOT NULL,
  locked_until timestamptz NOT NULL, expires_at timestamptz NOT NULL,
  resp_status integer, resp_header jsonb, resp_body bytea,
  PRIMARY KEY (scope, key))`); err != nil {
		b.Fatal(err)
	}
	ins := `INSERT INTO ` + table + ` (scope, key, token, status, locked_until, expires_at)
VALUES ($1, $2, nextval('` + s.names.seq + `'), 'processing', now() + $3::bigint * interval '1 microsecond',
        now() + $4::bigint * interval '1 microsecond') RETURNING token`
	upd := `UPDATE ` + table + ` SET status = 'completed', resp_status = $4, resp_header = $5, resp_body = $6
WHERE scope = $1 AND key = $2 AND token = $3 AND status = 'processing'`
	idxTable := s.names.schema + `."floor_idx_records"`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+idxTable+` (LIKE `+table+` INCLUDING ALL)`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE INDEX ON `+idxTable+` (expires_at)`); err != nil {
		b.Fatal(err)
	}
	insIdx := strings.Replace(ins, table, idxTable, 1)
	updIdx := strings.Replace(upd, table, idxTable, 1)

	resp := core.StoredResponse{
		Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"pay_123","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`),
	}
	header := []byte(`{"Content-Type":["application/json"]}`)
	lease, retention := 30*time.Second, 24*time.Hour

	storePair := func(ctx context.Context, key string) error {
		req := core.ClaimRequest{Scope: "tenant", Key: key, Method: "POST", Route: "/v1/payments",
			Fingerprint: "dfc677705bff7f80e09867a974d28d76f46cd6a2e23f1e28a3037723f1970e86",
			Lease:       lease, Retention: retention}
		res, err := s.Claim(ctx, req)
		if err != nil {
			return err
		}
		if !res.Claimed {
			return fmt.Errorf("key %s not claimed", key)
		}
		return s.Complete(ctx, core.Fence{Scope: req.Scope, Key: key, Token: res.Record.Token}, resp)
	}
	floorOn := func(ins, upd string) func(ctx context.Context, key string) error {
		return func(ctx context.Context, key string) error {
			var tok int64
			if err := pool.QueryRow(ctx, ins, "tenant", key, micros(lease), micros(retention)).Scan(&tok); err != nil {
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
		}
	}
	floorPair, floorIdxPair := floorOn(ins, upd), floorOn(insIdx, updIdx)

	// Warm both up (connections, prepared statements, first pages).
	prefix := "f" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	var seq atomic.Int64
	if err := runRound(ctx, workers, 4*workers, prefix, &seq, storePair); err != nil {
		b.Fatal(err)
	}
	if err := runRound(ctx, workers, 4*workers, prefix, &seq, floorPair); err != nil {
		b.Fatal(err)
	}
	if err := runRound(ctx, workers, 4*workers, prefix, &seq, floorIdxPair); err != nil {
		b.Fatal(err)
	}

	round := max(8*workers, 100)
	var (
		ratios, idxRatios             []float64
		storeTime, floorTime, idxTime time.Duration
	)
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		t0 := time.Now()
		if err := runRound(ctx, workers, n, prefix, &seq, storePair); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := runRound(ctx, workers, n, prefix, &seq, floorPair); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := runRound(ctx, workers, n, prefix, &seq, floorIdxPair); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		storeTime += t1.Sub(t0)
		floorTime += t2.Sub(t1)
		idxTime += t3.Sub(t2)
		// Throughput ratios of adjacent rounds (same n: the inverse of the
		// time ratio).
		ratios = append(ratios, t2.Sub(t1).Seconds()/t1.Sub(t0).Seconds())
		idxRatios = append(idxRatios, t3.Sub(t2).Seconds()/t1.Sub(t0).Seconds())
	}
	b.StopTimer()
	median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	b.ReportMetric(median(ratios), "store/floor")
	b.ReportMetric(median(idxRatios), "store/floor+idx")
	b.ReportMetric(float64(b.N)/storeTime.Seconds(), "store-pairs/s")
	b.ReportMetric(float64(b.N)/floorTime.Seconds(), "floor-pairs/s")
	b.ReportMetric(float64(b.N)/idxTime.Seconds(), "floor+idx-pairs/s")
}

// runRound runs n pairs over workers goroutines, each with a fresh key.
func runRound(ctx context.Context, workers, n int, prefix string, seq *atomic.Int64, pair func(context.Context, string) error) error {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		firstErr atomic.Value
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := pair(ctx, prefix+strconv.FormatInt(seq.Add(1), 10)); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return nil
}
