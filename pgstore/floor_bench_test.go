package pgstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// BenchmarkFloor measures the store's claim+complete (a first execution:
// fresh key, claim, store the response) against floors: the simplest
// statements that could do the job, sent with pgx on the same pool, one
// round trip and one commit each, as the store's are. It also runs the
// store calling its claim function first, as it does during a retry storm
// ("function-first", reported against the same floors as
// function-first/<variant>).
//
//   - claim: the two raw statements on the store's own tables that do the
//     job atomically: INSERT ... ON CONFLICT (scope, key) DO NOTHING
//     RETURNING token of the processing record (every column the store
//     keeps: method, route, fingerprint, the three timestamps) — the least
//     a claim can be and still not fail on a duplicate — then the store's
//     own fenced complete statement. What the store adds over it is what
//     makes a duplicate a read or a takeover in the same statement (the
//     gated slow-path branch) and its Go code.
//
//   - raw: the same with a plain INSERT (no ON CONFLICT): a duplicate
//     would fail with a unique violation instead of being read.
//
//   - floor: the narrowest table that can hold a claim and a response,
//     with only the primary key —
//
//     INSERT INTO t (scope, key, token, status, locked_until, expires_at)
//     VALUES (..., nextval(seq), 'processing', ...) RETURNING token
//     UPDATE t SET status = 'completed', resp_* = ...
//     WHERE scope = $1 AND key = $2 AND token = $3 AND status = 'processing'
//
//     It stores no fingerprint, method or route (no 422 possible) and
//     errors on a duplicate instead of reading it.
//
//   - floor+idx: the same on a copy of that table with a B-tree index on
//     expires_at, as the store's table has for its sweeper: the difference
//     between floor and floor+idx is what retention's index costs, whoever
//     runs the statements.
//
// The machine this runs on is shared and noisy, so the variants are not
// run one after the other for seconds each: they alternate in rounds of 8
// pairs per worker (at least 100), and each reported ratio is the median
// over rounds of the store's throughput over the other's in the same
// round, which cancels most of the drift. Also reported: each variant's
// overall pairs/s. b.N is the number of pairs each variant runs; use a
// fixed count, e.g. -benchtime 2000x.
//
// Keys: "random" keys are shaped like UUIDv4, what clients are told to send
// (and what the IETF draft and Stripe recommend); "sequential" keys
// (prefix + counter, like UUIDv7 or ULID issued in order) send every
// insert to the rightmost leaf of the primary-key index, where 16 workers
// queue on one page lock. That hot spot costs an INSERT ... ON CONFLICT
// (the store's claim) more than a plain INSERT (the floor's): the
// speculative insertion visits the leaf twice, a pre-check and the insert.
func BenchmarkFloor(b *testing.B) {
	for _, m := range modes {
		for _, random := range []bool{true, false} {
			for _, workers := range []int{1, 16, 64} {
				b.Run(fmt.Sprintf("%s/keys=%s/workers=%d", m.name, keyKind(random), workers), func(b *testing.B) {
					benchFloor(b, workers, random, m.opts)
				})
			}
		}
	}
}

func keyKind(random bool) string {
	if random {
		return "random"
	}
	return "sequential"
}

// keySource hands out fresh keys, random (UUIDv4-shaped) or sequential.
type keySource struct {
	random bool
	prefix string
	salt   uint64
	seq    atomic.Uint64
}

func newKeySource(random bool, prefix string) *keySource {
	return &keySource{random: random, prefix: prefix, salt: uint64(time.Now().UnixNano())}
}

func (k *keySource) next() string {
	n := k.seq.Add(1)
	if !k.random {
		return k.prefix + strconv.FormatUint(n, 10)
	}
	// Unique and scattered: xor with a salt and multiplication by an odd
	// constant are bijections on uint64; the rest only shapes a UUID.
	hi := (n ^ k.salt) * 0x9E3779B97F4A7C15
	lo := (hi ^ hi>>29) * 0xBF58476D1CE4E5B9
	return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", hi>>32, hi>>16&0xffff, hi&0xfff, 0x8000|lo>>48&0x3fff, lo&0xffffffffffff)
}

// pairFunc runs one first execution (claim and complete) on a fresh key.
type pairFunc func(ctx context.Context, key string) error

// floorVariant is one way of running a first execution: the store's, or
// raw statements.
type floorVariant struct {
	name string
	pair pairFunc
}

// floorVariants builds the store (the bare insert first: fresh keys
// only), the same store calling the claim function first
// ("function-first") and the raw-statement variants on pool (tables
// created in the store's schema). IDEM_FLOOR_DIAG=1 adds two
// diagnostic variants that split the store's claim into its parts:
//
//   - fn: the store's claim statement (the call of its claim function)
//     sent raw, only the token read from the composite: store vs fn is
//     pgstore's Go code;
//   - claim17: the function's fast path as a top-level statement (the
//     INSERT ... ON CONFLICT DO NOTHING RETURNING the 17 columns), read
//     the same way: fn vs claim17 is the PL/pgSQL call; claim17 vs claim
//     is the width of the result.
func floorVariants(b *testing.B, pool *pgxpool.Pool, s *Store, opts []Option) []floorVariant {
	ctx := context.Background()
	// The same store calling the function first, on the same table.
	fnFirst := openStore(b, pool, append([]Option{WithSchema(s.cfg.schema), withFunctionFirst()}, opts...)...)

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
	// raw and claim: the record the claim's fast path inserts, as a plain
	// INSERT into the store's own table, and with ON CONFLICT DO NOTHING.
	insRaw := `INSERT INTO ` + s.names.table + ` (` + recordCols + `)
VALUES ($1, $2, $3, $4, $5, 'processing', nextval('` + s.names.seq + `'), now() + $6::bigint * interval '1 microsecond',
        now(), now() + $7::bigint * interval '1 microsecond')`
	insClaim := insRaw + ` ON CONFLICT (scope, key) DO NOTHING RETURNING token`
	insRaw += ` RETURNING token`

	resp := storekit.StoredResponse{
		Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"pay_123","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`),
	}
	header := []byte(`{"Content-Type":["application/json"]}`)
	lease, retention := 30*time.Second, 24*time.Hour
	const fingerprint = "dfc677705bff7f80e09867a974d28d76f46cd6a2e23f1e28a3037723f1970e86"

	storePair := func(s *Store) pairFunc {
		return func(ctx context.Context, key string) error {
			req := storekit.ClaimRequest{Scope: "tenant", Key: key, Method: "POST", Route: "/v1/payments",
				Fingerprint: fingerprint, Lease: lease, Retention: retention}
			res, err := s.Claim(ctx, req)
			if err != nil {
				return err
			}
			if !res.Claimed {
				return fmt.Errorf("key %s not claimed", key)
			}
			return s.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: key, Token: res.Record.Token}, resp)
		}
	}
	recordOn := func(ins string) pairFunc {
		return func(ctx context.Context, key string) error {
			var tok int64
			if err := pool.QueryRow(ctx, ins, "tenant", key, "POST", "/v1/payments", fingerprint,
				micros(lease), micros(retention)).Scan(&tok); err != nil {
				return err
			}
			return expectOne(pool.Exec(ctx, s.sql.complete, "tenant", key, tok, int32(201), header, resp.Body, false))
		}
	}
	floorOn := func(ins, upd string) pairFunc {
		return func(ctx context.Context, key string) error {
			var tok int64
			if err := pool.QueryRow(ctx, ins, "tenant", key, micros(lease), micros(retention)).Scan(&tok); err != nil {
				return err
			}
			return expectOne(pool.Exec(ctx, upd, "tenant", key, tok, int32(201), header, resp.Body))
		}
	}
	variants := []floorVariant{
		{"store", storePair(s)},
		{"function-first", storePair(fnFirst)},
		{"claim", recordOn(insClaim)},
		{"raw", recordOn(insRaw)},
		{"floor", floorOn(ins, upd)},
		{"floor+idx", floorOn(insIdx, updIdx)},
	}
	if os.Getenv("IDEM_FLOOR_DIAG") == "" {
		return variants
	}
	rawOn := func(ins string, fn bool) pairFunc {
		return func(ctx context.Context, key string) error {
			args := []any{"tenant", key, "POST", "/v1/payments", fingerprint, micros(lease), micros(retention)}
			if fn {
				args = append([]any{claimResultFormat}, args...)
			}
			rows, err := pool.Query(ctx, ins, args...)
			if err != nil {
				return err
			}
			var tok int64
			for rows.Next() {
				v := rows.RawValues()
				if fn && len(v) == 1 {
					// The composite: count, then (OID, length, bytes) per
					// column; the token is the 7th, after five NULL texts and
					// a NULL status on the fast path.
					if b := v[0]; len(b) >= 4+6*8+8+8 {
						tok = int64(binary.BigEndian.Uint64(b[4+6*8+8:]))
					}
				} else if len(v) > 6 && len(v[6]) == 8 {
					tok = int64(binary.BigEndian.Uint64(v[6]))
				}
			}
			if err := rows.Err(); err != nil {
				return err
			}
			return expectOne(pool.Exec(ctx, s.sql.complete, "tenant", key, tok, int32(201), header, resp.Body, false))
		}
	}
	claim17 := strings.Replace(insClaim, "RETURNING token", `RETURNING scope, key, method, route, fingerprint, status, token,
  locked_until, created_at, expires_at, NULL::integer, NULL::jsonb, NULL::bytea, false, false, true, now()`, 1)
	return append(variants, floorVariant{"fn", rawOn(s.sql.claim, true)}, floorVariant{"claim17", rawOn(claim17, false)})
}

func benchFloor(b *testing.B, workers int, random bool, opts []Option) {
	cfg := pgstoretest.Config(b)
	cfg.MaxConns = int32(workers)
	cfg.MinConns = int32(workers)
	pool := pgstoretest.NewPool(b, cfg)
	s := newStore(b, pool, opts...)
	variants := floorVariants(b, pool, s, opts)

	round := max(8*workers, 100)
	ratios := make([][]float64, len(variants))    // store over variant i, per round
	fnRatios := make([][]float64, len(variants))  // function-first over variant i, per round
	total := make([]time.Duration, len(variants)) // per variant
	took := make([]time.Duration, len(variants))
	keys := newKeySource(random, "f"+strconv.FormatInt(time.Now().UnixNano(), 36)+"-")
	alternate(b, workers, round, keys, variants, func(i int, run func()) {
		t0 := time.Now()
		run()
		took[i] = time.Since(t0)
		total[i] += took[i]
	}, func() {
		// Throughput ratios within a round (same n: the inverse of the
		// time ratio).
		for i := range variants[1:] {
			ratios[i+1] = append(ratios[i+1], took[i+1].Seconds()/took[0].Seconds())
		}
		for i := range variants[2:] {
			fnRatios[i+2] = append(fnRatios[i+2], took[i+2].Seconds()/took[1].Seconds())
		}
	})
	b.StopTimer()
	median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	for i, v := range variants {
		if i > 0 {
			b.ReportMetric(median(ratios[i]), "store/"+v.name)
		}
		if i > 1 {
			b.ReportMetric(median(fnRatios[i]), "function-first/"+v.name)
		}
		b.ReportMetric(float64(b.N)/total[i].Seconds(), v.name+"-pairs/s")
	}
}

// alternate warms every variant up (connections, prepared statements,
// first pages), then runs b.N pairs of each in rounds of round pairs,
// rotating the order every round so that no variant always runs right
// after another (a checkpoint or autovacuum landing on one slot). measure
// wraps each variant's share of a round (run runs it); roundDone follows
// each round. The benchmark timer covers the rounds only.
func alternate(b *testing.B, workers, round int, keys *keySource, variants []floorVariant, measure func(i int, run func()), roundDone func()) {
	ctx := context.Background()
	for _, v := range variants {
		if err := runRound(ctx, workers, 4*workers, keys, v.pair); err != nil {
			b.Fatalf("%s: %v", v.name, err)
		}
	}
	b.ResetTimer()
	for done, r := 0, 0; done < b.N; done, r = done+round, r+1 {
		n := min(round, b.N-done)
		for j := range variants {
			i := (j + r) % len(variants)
			measure(i, func() {
				if err := runRound(ctx, workers, n, keys, variants[i].pair); err != nil {
					b.Fatalf("%s: %v", variants[i].name, err)
				}
			})
		}
		roundDone()
	}
	b.StopTimer()
}

// expectOne checks that a fenced update matched exactly one row.
func expectOne(tag pgconn.CommandTag, err error) error {
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("update matched %d rows", tag.RowsAffected())
	}
	return nil
}

// runRound runs n pairs over workers goroutines, each with a fresh key.
func runRound(ctx context.Context, workers, n int, keys *keySource, pair func(context.Context, string) error) error {
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
				if err := pair(ctx, keys.next()); err != nil {
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

// BenchmarkFloorCPU measures what BenchmarkFloor's variants cost in CPU
// time, which the machine's other load disturbs far less than throughput:
// the variants alternate in rounds as in BenchmarkFloor, and each reports
//
//   - server-ns/pair: the CPU time of every PostgreSQL process on this
//     machine (backends, WAL writer, checkpointer; /proc/<pid>/schedstat),
//     so run it with nothing else using the server, and
//   - client-ns/pair: the test process's CPU time (all threads, GC
//     included).
//
// At 16 workers on a machine whose cores the server and the clients share,
// throughput follows the sum of the two. Linux, server on this machine.
func BenchmarkFloorCPU(b *testing.B) {
	for _, m := range modes {
		for _, workers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/workers=%d", m.name, workers), func(b *testing.B) { benchFloorCPU(b, workers, m.opts) })
		}
	}
}

func benchFloorCPU(b *testing.B, workers int, opts []Option) {
	cfg := pgstoretest.Config(b)
	cfg.MaxConns, cfg.MinConns = int32(workers), int32(workers)
	pool := pgstoretest.NewPool(b, cfg)
	s := newStore(b, pool, opts...)
	variants := floorVariants(b, pool, s, opts)
	if _, err := serverCPU(); err != nil {
		b.Skipf("server CPU time not readable (server on another machine?): %v", err)
	}
	server := make([]time.Duration, len(variants))
	client := make([]time.Duration, len(variants))
	alternate(b, workers, max(8*workers, 200), newKeySource(true, ""), variants, func(i int, run func()) {
		s0, err := serverCPU()
		if err != nil {
			b.Fatal(err)
		}
		c0 := processCPU()
		run()
		client[i] += processCPU() - c0
		s1, err := serverCPU()
		if err != nil {
			b.Fatal(err)
		}
		server[i] += s1 - s0
	}, func() {})
	b.StopTimer()
	for i, v := range variants {
		b.ReportMetric(float64(server[i].Nanoseconds())/float64(b.N), v.name+"-server-ns/pair")
		b.ReportMetric(float64(client[i].Nanoseconds())/float64(b.N), v.name+"-client-ns/pair")
	}
}
