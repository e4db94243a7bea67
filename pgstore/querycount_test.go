package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
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

// TestStatementCache: on one connection a Store's first claim prepares its
// two statements (the schema check, the bare insert), the first claim of
// an existing key the claim function's, and nothing is prepared again
// after them. (Statements per phase: txtest's QueryCounts.)
func TestStatementCache(t *testing.T) {
	tr := &countingTracer{}
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = tr
	s := newStore(t, pgstoretest.NewPool(t, cfg))
	tr.reset() // the migration's
	_, err := s.Claim(t.Context(), claimReq("warm", time.Minute))
	require.NoError(t, err)
	_, prepares := tr.snapshot()
	require.Equal(t, 2, prepares, "first claim's preparations")
	tr.reset()
	_, err = s.Claim(t.Context(), claimReq("warm", time.Minute))
	require.NoError(t, err)
	_, prepares = tr.snapshot()
	require.Equal(t, 1, prepares, "first existing key's preparations")
	tr.reset()
	for range 3 {
		_, err := s.Claim(t.Context(), claimReq("again", time.Minute))
		require.NoError(t, err)
	}
	_, prepares = tr.snapshot()
	require.Zero(t, prepares, "preparations after the first claim")
}

// TestQueryCountsClaim: while new keys dominate, a new key costs one
// statement (the bare insert) and an existing key two (the insert that
// finds it, then the claim-or-read function); during a retry storm every
// claim is one call of the function.
func TestQueryCountsClaim(t *testing.T) {
	tr := &countingTracer{}
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = tr
	pool := pgstoretest.NewPool(t, cfg)
	s := newStore(t, pool)
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

	// A retry storm: once a quarter of recent claims find their key
	// (serial claims share no statements, see insertFirst), the store
	// calls the claim function directly (one statement per replay)...
	n := 1
	for ; n < 100 && s.insertFirst(); n++ {
		count("claim (replay in a storm)", 2, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
	}
	if s.insertFirst() {
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
	for i := 0; !s.insertFirst(); i++ {
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

// TestClaimSwitchFollowsSharing: a third of recent claims finding their
// key keeps the bare insert first where the writes' statements are shared
// (plain mode, batching, the limit fallen: a new key's insert rides with
// the completes) and calls the function first elsewhere (a database a
// round trip away or idle, WithTransactional's inserts in statements of
// their own, WithoutBatching), where the second round trip is the price.
func TestClaimSwitchFollowsSharing(t *testing.T) {
	pool := pgstoretest.Pool(t)
	for _, c := range []struct {
		name  string
		opts  []Option
		limit float64
		want  bool
	}{
		{"shared", nil, 1, true},
		{"not shared", nil, limitMax, false},
		{"transactional, shared", []Option{WithTransactional()}, 1, false},
		{"unbatched", []Option{WithoutBatching()}, 1, false},
	} {
		s := newStore(t, pool, c.opts...)
		for i := range 300 {
			s.mix.Observe(i%3 == 0) // a third existing
		}
		s.writes.mu.Lock()
		s.writes.limit = c.limit
		s.writes.mu.Unlock()
		assert.Equal(t, c.want, s.insertFirst(), c.name)
	}
}
