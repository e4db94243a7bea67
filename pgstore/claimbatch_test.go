package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestClaimBatch drives claimBatch deterministically: a test transaction
// holds a SHARE lock on the records table, so the first claim's insert
// waits and holds the one running slot; the claims sent meanwhile queue,
// and once the lock goes they must travel in one statement and each get
// the answer a claim of its own would have got.
func TestClaimBatch(t *testing.T) {
	type variant struct {
		name     string
		execMode pgx.QueryExecMode
		opts     []Option
	}
	var variants []variant
	for _, m := range modes {
		variants = append(variants,
			variant{m.name, 0, m.opts},
			variant{m.name + "/transactional", 0, append([]Option{WithTransactional()}, m.opts...)},
			variant{m.name + "/simple_protocol", pgx.QueryExecModeSimpleProtocol, m.opts},
		)
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			tr := &countingTracer{}
			cfg := pgstoretest.Config(t)
			cfg.MaxConns = 8
			cfg.ConnConfig.Tracer = tr
			if v.execMode != 0 {
				cfg.ConnConfig.DefaultQueryExecMode = v.execMode
			}
			pool := pgstoretest.NewPool(t, cfg)
			s := newStore(t, pool, append([]Option{WithInsertFirst()}, v.opts...)...)
			ctx := t.Context()

			// A completed key, so that the batch also carries a replay.
			done := claimReq("done", time.Minute)
			res, err := s.Claim(ctx, done)
			if err != nil || !res.Claimed {
				t.Fatalf("claim done: %+v, %v", res, err)
			}
			if err := s.Complete(ctx, storekit.Fence{Scope: done.Scope, Key: done.Key, Token: res.Record.Token}, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
				t.Fatal(err)
			}

			// The queued claims: new keys (two of them the same key) and
			// the completed one, in no particular order.
			keys := []string{"n3", "n1", "done", "twin", "n2", "twin"}
			results := batchRound(t, s, tr, keys, nil)

			claimed := map[string]int{}
			for i, k := range keys {
				r := results[i]
				if r.err != nil {
					t.Errorf("claim %s: %v", k, r.err)
					continue
				}
				if r.res.Claimed {
					claimed[k]++
					if !r.res.Fresh || r.res.Record.Status != storekit.StatusProcessing || r.res.Record.Key != k || r.res.Record.Token == 0 {
						t.Errorf("claim %s: %+v, want a fresh processing record", k, r.res)
					}
				}
			}
			for _, k := range []string{"n1", "n2", "n3", "twin"} {
				if claimed[k] != 1 {
					t.Errorf("key %s claimed %d times, want exactly once", k, claimed[k])
				}
			}
			if claimed["done"] != 0 {
				t.Errorf("the completed key was claimed again")
			}
			for i, k := range keys {
				if k == "done" {
					if r := results[i].res; r.Record.Status != storekit.StatusCompleted || r.Record.Response == nil || string(r.Record.Response.Body) != "ok" {
						t.Errorf("completed key answered %+v, want its stored response", r)
					}
				}
			}
			// Each claimed record is what the store holds, token and all.
			for i, k := range keys {
				if r := results[i]; r.err == nil && r.res.Claimed {
					got, err := s.Get(ctx, "tenant", k)
					if err != nil || got.Token != r.res.Record.Token || got.Status != storekit.StatusProcessing || !got.CreatedAt.Equal(r.res.Record.CreatedAt) {
						t.Errorf("record %s: %+v, %v; the claim answered %+v", k, got, err, r.res.Record)
					}
				}
			}
		})
	}
}

// TestClaimBatchIsolation: a batch that fails (here: one claim's key holds
// a NUL, which PostgreSQL's text refuses) sends each claim again on its
// own, so only the bad one fails; a claim whose context ends while it
// queues leaves the queue and creates nothing.
func TestClaimBatchIsolation(t *testing.T) {
	t.Parallel()
	tr := &countingTracer{}
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = tr
	pool := pgstoretest.NewPool(t, cfg)
	s := newStore(t, pool, WithInsertFirst())
	ctx := t.Context()

	keys := []string{"a1", "bad\x00key", "a2"}
	results := batchRound(t, s, tr, keys, nil)
	for i, k := range keys {
		r := results[i]
		if k == keys[1] {
			if r.err == nil {
				t.Errorf("the NUL key was claimed: %+v", r.res)
			} else if strings.Contains(r.err.Error(), "\x00") || strings.Contains(r.err.Error(), "bad") {
				t.Errorf("the error carries the key: %v", r.err)
			}
			continue
		}
		if r.err != nil || !r.res.Claimed {
			t.Errorf("claim %s beside a bad one: %+v, %v; want claimed", k, r.res, r.err)
		}
	}

	// A claim cancelled while it queues.
	cctx, cancel := context.WithCancel(ctx)
	results = batchRound(t, s, tr, []string{"c1", "gone"}, func(i int) context.Context {
		if i == 1 {
			return cctx
		}
		return ctx
	}, cancel)
	if r := results[1]; !errors.Is(r.err, context.Canceled) {
		t.Errorf("cancelled claim: %+v, %v; want context.Canceled", r.res, r.err)
	}
	if r := results[0]; r.err != nil || !r.res.Claimed {
		t.Errorf("claim beside a cancelled one: %+v, %v", r.res, r.err)
	}
	if _, err := s.Get(ctx, "tenant", "gone"); !errors.Is(err, storekit.ErrNotFound) {
		t.Errorf("the cancelled claim's record: %v, want ErrNotFound", err)
	}
}

type batchResult struct {
	res storekit.ClaimResult
	err error
}

// batchRound blocks inserts into s's table with a SHARE lock, claims a
// warm-up key (it takes the running slot and waits on the lock), queues a
// claim per key (ctxOf gives each its context; nil: the test's), runs
// between (if any) once all are queued, releases the lock and returns the
// queued claims' results. It fails the test unless the queued claims that
// were still queued went out together in one batched statement.
func batchRound(t *testing.T, s *Store, tr *countingTracer, keys []string, ctxOf func(int) context.Context, between ...func()) []batchResult {
	t.Helper()
	ctx := t.Context()
	lock, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := lock.Exec(ctx, "LOCK TABLE "+s.names.table+" IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	tr.reset()
	var wg sync.WaitGroup
	first := make(chan error, 1)
	wg.Go(func() {
		_, err := s.Claim(ctx, claimReq(fmt.Sprintf("first-%d", time.Now().UnixNano()), time.Minute))
		first <- err
	})
	waitFor(t, func() bool { s.batch.mu.Lock(); defer s.batch.mu.Unlock(); return s.batch.running == 1 })
	results := make([]batchResult, len(keys))
	for i, k := range keys {
		c := ctx
		if ctxOf != nil {
			c = ctxOf(i)
		}
		wg.Go(func() {
			res, err := s.Claim(c, claimReq(k, time.Minute))
			results[i] = batchResult{res, err}
		})
	}
	waitFor(t, func() bool { s.batch.mu.Lock(); defer s.batch.mu.Unlock(); return len(s.batch.queue) == len(keys) })
	withdrawn := 0
	for _, fn := range between {
		fn()
		waitFor(t, func() bool { s.batch.mu.Lock(); defer s.batch.mu.Unlock(); return len(s.batch.queue) < len(keys) })
		withdrawn = 1
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := <-first; err != nil {
		t.Errorf("first claim: %v", err)
	}
	sqls, _ := tr.snapshot()
	batched := 0
	for _, q := range sqls {
		if strings.Contains(q, "unnest(") {
			batched++
		}
	}
	if want := 1; len(keys)-withdrawn > 1 && batched != want {
		t.Errorf("%d batched statements for %d queued claims, want %d; statements: %q", batched, len(keys)-withdrawn, want, sqls)
	}
	return results
}

// waitFor polls cond (a state the test waits for, not a duration).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
