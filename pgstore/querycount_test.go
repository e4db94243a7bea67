package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// countingTracer counts the statements pgx sends (every Exec, Query,
// QueryRow, including BEGIN and COMMIT) and the statement preparations.
type countingTracer struct {
	mu       sync.Mutex
	sqls     []string
	prepares int
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sqls = append(c.sqls, d.SQL)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A batch is traced as its statements, joined with " + ".
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var qs []string
	for _, q := range d.Batch.QueuedQueries {
		qs = append(qs, short(q.SQL))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sqls = append(c.sqls, "batch: "+strings.Join(qs, " + "))
	return ctx
}

func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (c *countingTracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prepares++
	return ctx
}

func (c *countingTracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (c *countingTracer) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sqls, c.prepares = nil, 0
}

func (c *countingTracer) snapshot() ([]string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.sqls...), c.prepares
}

func short(sql string) string {
	sql = strings.Join(strings.Fields(sql), " ")
	if len(sql) > 60 {
		sql = sql[:60] + "…"
	}
	return sql
}

// TestQueryCounts asserts the number of statements per phase: one for each
// of claim (new, replay, in flight, takeover), heartbeat, complete, fail and
// get; in transactional mode BEGIN when the handler first asks for the
// transaction, and at commit the fenced UPDATE plus COMMIT on the business
// transaction.
func TestQueryCounts(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			tr := &countingTracer{}
			cfg := pgstoretest.Config(t)
			cfg.MaxConns = 1 // one connection: prepared once, then cached
			cfg.ConnConfig.Tracer = tr
			pool := pgstoretest.NewPool(t, cfg)
			s := newStore(t, pool, m.opts...)
			table := ledger(t, s)
			ctx := t.Context()

			phase := func(name string, want int, fn func() error) {
				t.Helper()
				tr.reset()
				if err := fn(); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				sqls, _ := tr.snapshot()
				if len(sqls) != want {
					var list []string
					for _, q := range sqls {
						list = append(list, short(q))
					}
					t.Errorf("%s: %d statements, want %d: %q", name, len(sqls), want, list)
				}
			}
			// Warm the statement cache so that the counts below are the
			// steady state (and assert preparation happens once). A
			// Store's first claim also checks the schema version, once.
			warm := claimReq("warm", time.Minute)
			var wf storekit.Fence
			phase("first claim (schema check + claim)", 2, func() error {
				res, err := s.Claim(ctx, warm)
				wf = storekit.Fence{Scope: warm.Scope, Key: warm.Key, Token: res.Record.Token}
				return err
			})
			if _, prepares := tr.snapshot(); prepares != 2 {
				t.Errorf("first claim prepared %d statements, want 2", prepares)
			}
			phase("warm heartbeat", 1, func() error { return s.Heartbeat(ctx, wf, time.Minute) })
			phase("warm complete", 1, func() error { return s.Complete(ctx, wf, storekit.StoredResponse{Status: 200}) })
			phase("warm get", 1, func() error { _, err := s.Get(ctx, warm.Scope, warm.Key); return err })
			phase("warm claim + fail", 2, func() error {
				res, err := s.Claim(ctx, claimReq("warm2", time.Minute))
				if err != nil {
					return err
				}
				return s.Fail(ctx, storekit.Fence{Scope: "tenant", Key: "warm2", Token: res.Record.Token})
			})

			req := claimReq("k", 100*time.Millisecond)
			var f storekit.Fence
			phase("claim (new key)", 1, func() error {
				res, err := s.Claim(ctx, req)
				f = storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
				return err
			})
			phase("claim (in flight)", 1, func() error { _, err := s.Claim(ctx, req); return err })
			phase("heartbeat", 1, func() error { return s.Heartbeat(ctx, f, 100*time.Millisecond) })
			phase("fail", 1, func() error { return s.Fail(ctx, f) })
			phase("claim (takeover of failed)", 1, func() error {
				res, err := s.Claim(ctx, req)
				f.Token = res.Record.Token
				return err
			})
			phase("complete", 1, func() error {
				return s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("x")})
			})
			phase("claim (replay)", 1, func() error { _, err := s.Claim(ctx, req); return err })
			phase("get", 1, func() error { _, err := s.Get(ctx, req.Scope, req.Key); return err })

			// Transactional mode: round trips are pinned by
			// TestTxRoundTrips; here the statements (a batch counts as one).
			txReq := claimReq("tx", time.Minute)
			var hctx context.Context
			phase("claim (tx)", 1, func() error {
				res, err := s.Claim(ctx, txReq)
				f = storekit.Fence{Scope: txReq.Scope, Key: txReq.Key, Token: res.Record.Token}
				hctx = storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
				return err
			})
			phase("Tx (nothing sent)", 0, func() error { _, err := Tx(hctx); return err })
			phase("handler insert (BEGIN + INSERT)", 1, func() error { return handle(hctx, table, txReq.Key) })
			phase("Tx again (no statement)", 0, func() error { _, err := Tx(hctx); return err })
			phase("complete in tx (UPDATE + COMMIT)", 1, func() error {
				return s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
			})
			// In transactional mode, Fail: ROLLBACK + fenced UPDATE.
			txReq.Key = "tx2"
			phase("claim (tx2)", 1, func() error {
				res, err := s.Claim(ctx, txReq)
				f = storekit.Fence{Scope: txReq.Scope, Key: txReq.Key, Token: res.Record.Token}
				hctx = storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
				return err
			})
			phase("handler insert 2", 1, func() error { return handle(hctx, table, txReq.Key) })
			phase("fail in tx (ROLLBACK + UPDATE)", 1, func() error { return s.Fail(hctx, f) })

			// Everything above ran on one connection with its statements
			// prepared during the warm-up only.
			tr.reset()
			for range 3 {
				r := claimReq("again", time.Minute)
				if _, err := s.Claim(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			if _, prepares := tr.snapshot(); prepares != 0 {
				t.Errorf("%d statement preparations after warm-up, want 0 (statement cache)", prepares)
			}
		})
	}
}

// TestQueryCountsOptimisticClaim: with WithInsertFirst a new key costs
// one statement (the bare insert) and an existing key two (the insert that
// finds it, then the claim-or-read function).
func TestQueryCountsOptimisticClaim(t *testing.T) {
	tr := &countingTracer{}
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = tr
	pool := pgstoretest.NewPool(t, cfg)
	s := newStore(t, pool, WithInsertFirst())
	ctx := t.Context()
	if _, err := s.Claim(ctx, claimReq("warm", time.Minute)); err != nil { // and the schema check
		t.Fatal(err)
	}
	count := func(name string, want int, fn func() (storekit.ClaimResult, error)) storekit.ClaimResult {
		t.Helper()
		tr.reset()
		res, err := fn()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if sqls, _ := tr.snapshot(); len(sqls) != want {
			t.Errorf("%s: %d statements, want %d", name, len(sqls), want)
		}
		return res
	}
	req := claimReq("k", time.Minute)
	res := count("claim (new key)", 1, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
	if !res.Claimed || res.Record.Status != storekit.StatusProcessing || res.Record.Fingerprint != req.Fingerprint {
		t.Fatalf("new key: %+v", res)
	}
	if err := s.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	res = count("claim (replay)", 2, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
	if res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil {
		t.Fatalf("replay: %+v", res)
	}

	// A retry storm: once a quarter of recent claims find their key, the
	// store calls the claim function directly (one statement per replay)...
	n := 1
	for ; n < 100 && s.mix.insertFirst(); n++ {
		count("claim (replay in a storm)", 2, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
	}
	if s.mix.insertFirst() {
		t.Fatalf("still inserting first after %d replays in a row", n)
	}
	if n < 5 {
		t.Errorf("switched after %d replays: one retry should not flip the strategy", n)
	}
	for range 3 {
		res = count("claim (replay, function first)", 1, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
		if res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil {
			t.Fatalf("replay, function first: %+v", res)
		}
	}
	// ...and goes back to the bare insert when new keys dominate again.
	for i := 0; !s.mix.insertFirst(); i++ {
		if i == 100 {
			t.Fatal("still calling the function first after 100 new keys")
		}
		res := count("claim (new key, function first)", 1, func() (storekit.ClaimResult, error) {
			return s.Claim(ctx, claimReq(fmt.Sprintf("new-%d", i), time.Minute))
		})
		if !res.Claimed || !res.Fresh {
			t.Fatalf("new key, function first: %+v", res)
		}
	}
	res = count("claim (new key, inserting first again)", 1, func() (storekit.ClaimResult, error) {
		return s.Claim(ctx, claimReq("after-the-storm", time.Minute))
	})
	if !res.Claimed || !res.Fresh {
		t.Fatalf("new key after the storm: %+v", res)
	}
	if sqls, _ := tr.snapshot(); len(sqls) != 1 || !strings.Contains(sqls[0], "ON CONFLICT (scope, key) DO NOTHING") {
		t.Errorf("after the storm the claim sent %q, want the bare insert", sqls)
	}
}
