package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	for _, v := range batchVariants() {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			s, tr := tracedStore(t, v.execMode, append([]Option{withBatchLimit(1)}, v.opts...)...)
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
			results := insertRound(t, s, tr, keys, nil)

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

// TestClaimBatchCalls: the same for the claim function's calls (the
// store calling the function first, as in a retry storm): new keys, a
// key twice, a replay, a takeover and a fingerprint mismatch in one
// statement, each answered as its own call would be.
func TestClaimBatchCalls(t *testing.T) {
	for _, m := range modes {
		for _, kind := range []string{"", "/transactional", "/function_only"} {
			name := m.name + kind
			opts := append([]Option{withBatchLimit(1)}, m.opts...)
			switch kind {
			case "/transactional":
				opts = append(opts, WithTransactional())
			case "/function_only": // every claim calls the function
				opts = append(opts, withFunctionFirst())
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s, tr := tracedStore(t, 0, opts...)
				ctx := t.Context()
				end := func(key string, fail bool) int64 {
					t.Helper()
					res, err := s.Claim(ctx, claimReq(key, time.Minute))
					if err != nil || !res.Claimed {
						t.Fatalf("claim %s: %+v, %v", key, res, err)
					}
					f := storekit.Fence{Scope: "tenant", Key: key, Token: res.Record.Token}
					if fail {
						err = s.Fail(ctx, f)
					} else {
						err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")})
					}
					if err != nil {
						t.Fatal(err)
					}
					return res.Record.Token
				}
				end("done", false)
				failedTok := end("failed", true)
				end("mismatch", true)
				setMix(&s.mix, true) // a retry storm: the function first

				keys := []string{"n2", "mismatch", "twin", "done", "failed", "n1", "twin"}
				ctxOf := func(i int) context.Context { return ctx }
				results := batchRoundReqs(t, s, tr, &s.calls, callsMarker, keys, func(i int) storekit.ClaimRequest {
					r := claimReq(keys[i], time.Minute)
					if keys[i] == "mismatch" {
						r.Fingerprint = "beef"
					}
					return r
				}, ctxOf)
				claimed := map[string]int{}
				for i, k := range keys {
					r := results[i]
					if r.err != nil {
						t.Errorf("claim %s: %v", k, r.err)
						continue
					}
					if r.res.Claimed {
						claimed[k]++
					}
					switch k {
					case "n1", "n2":
						if !r.res.Claimed || !r.res.Fresh || r.res.Record.Key != k || r.res.Record.Status != storekit.StatusProcessing {
							t.Errorf("new key %s: %+v, want claimed and fresh", k, r.res)
						}
					case "done":
						if r.res.Claimed || r.res.Record.Status != storekit.StatusCompleted || r.res.Record.Response == nil || string(r.res.Record.Response.Body) != "ok" {
							t.Errorf("completed key: %+v, want its stored response", r.res)
						}
					case "failed":
						if !r.res.Claimed || r.res.Fresh || r.res.Record.Token <= failedTok {
							t.Errorf("failed key: %+v, want taken over (claimed, not fresh, a larger token than %d)", r.res, failedTok)
						}
					case "mismatch":
						if r.res.Claimed || r.res.Record.Status != storekit.StatusFailed || r.res.Record.Fingerprint != "f00d" {
							t.Errorf("mismatched key: %+v, want the failed record unclaimed", r.res)
						}
					}
				}
				if claimed["twin"] != 1 {
					t.Errorf("a key sent twice was claimed %d times, want once", claimed["twin"])
				}
				for i, k := range keys {
					if r := results[i]; r.err == nil && r.res.Claimed {
						got, err := s.Get(ctx, "tenant", k)
						if err != nil || got.Token != r.res.Record.Token || got.Status != storekit.StatusProcessing {
							t.Errorf("record %s: %+v, %v; the claim answered %+v", k, got, err, r.res.Record)
						}
					}
				}
			})
		}
	}
}

// TestClaimBatchIsolation: a batch that fails (here: one claim's key holds
// a NUL, which PostgreSQL's text refuses) sends each claim again on its
// own, so only the bad one fails; a claim whose context ends while it
// queues leaves the queue and creates nothing.
func TestClaimBatchIsolation(t *testing.T) {
	t.Parallel()
	s, tr := tracedStore(t, 0, withBatchLimit(1))
	ctx := t.Context()

	keys := []string{"a1", "bad\x00key", "a2"}
	results := insertRound(t, s, tr, keys, nil)
	// The same through the function's calls (called first in a storm).
	setMix(&s.mix, true)
	calls := batchRound(t, s, tr, &s.calls, callsMarker, []string{"f1", "bad\x00key", "f2"}, nil)
	setMix(&s.mix, false)
	for i, r := range calls {
		if i == 1 {
			if r.err == nil {
				t.Errorf("the NUL key was claimed by the function: %+v", r.res)
			}
		} else if r.err != nil || !r.res.Claimed {
			t.Errorf("function claim beside a bad one: %+v, %v; want claimed", r.res, r.err)
		}
	}
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
	results = insertRound(t, s, tr, []string{"c1", "gone"}, func(i int) context.Context {
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

// batchVariant is a configuration the batching tests run in.
type batchVariant struct {
	name     string
	execMode pgx.QueryExecMode // 0: pgx's default
	opts     []Option
}

// batchVariants: each mode as is, transactional, and on the simple
// protocol.
func batchVariants() []batchVariant {
	var vs []batchVariant
	for _, m := range modes {
		vs = append(vs,
			batchVariant{m.name, 0, m.opts},
			batchVariant{m.name + "/transactional", 0, append([]Option{WithTransactional()}, m.opts...)},
			batchVariant{m.name + "/simple_protocol", pgx.QueryExecModeSimpleProtocol, m.opts},
		)
	}
	return vs
}

// tracedStore is a store with opts on a pool of its own (8 connections,
// execMode unless 0) whose statements the returned tracer sees.
func tracedStore(t *testing.T, execMode pgx.QueryExecMode, opts ...Option) (*Store, *countingTracer) {
	t.Helper()
	tr := &countingTracer{}
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = tr
	if execMode != 0 {
		cfg.ConnConfig.DefaultQueryExecMode = execMode
	}
	return newStore(t, pgstoretest.NewPool(t, cfg), opts...), tr
}

type batchResult struct {
	res storekit.ClaimResult
	err error
}

// Each kind of batched statement, as the tracer sees it.
var (
	insertsMarker = contains("DO NOTHING\nRETURNING scope, key")
	callsMarker   = contains("WITH ORDINALITY")
)

func contains(marker string) func(string) bool {
	return func(q string) bool { return strings.Contains(q, marker) }
}

// insertRound is batchRound for a new key's inserts: in the writes'
// pipeline (plain mode), or in one statement of their own
// (WithTransactional: their commits are asynchronous).
func insertRound(t *testing.T, s *Store, tr *countingTracer, keys []string, ctxOf func(int) context.Context, between ...func()) []batchResult {
	t.Helper()
	if s.cfg.transactional {
		return batchRound(t, s, tr, &s.inserts, insertsMarker, keys, ctxOf, between...)
	}
	claim := short(s.sql.claimNew)
	inPipeline := func(q string) bool { return strings.HasPrefix(q, "batch: ") && strings.Contains(q, claim) }
	return batchRound(t, s, tr, &s.writes, inPipeline, keys, ctxOf, between...)
}

// batchRound blocks inserts into s's table with a SHARE lock, claims a
// warm-up key through b (it takes b's running slot and waits on the
// lock: a new key's insert, or the claim function's), queues a
// claim per key (ctxOf gives each its context; nil: the test's), runs
// between (if any) once all are queued, releases the lock and returns the
// queued claims' results. It fails the test unless the queued claims that
// were still queued went out together in one statement of b's kind
// (marker).
func batchRound[P batchItem](t *testing.T, s *Store, tr *countingTracer, b *batcher[P], marker func(string) bool, keys []string, ctxOf func(int) context.Context, between ...func()) []batchResult {
	t.Helper()
	return batchRoundReqs(t, s, tr, b, marker, keys, func(i int) storekit.ClaimRequest { return claimReq(keys[i], time.Minute) }, ctxOf, between...)
}

// batchRoundReqs is batchRound with the requests from reqOf.
func batchRoundReqs[P batchItem](t *testing.T, s *Store, tr *countingTracer, b *batcher[P], marker func(string) bool, keys []string, reqOf func(int) storekit.ClaimRequest, ctxOf func(int) context.Context, between ...func()) []batchResult {
	t.Helper()
	ctx := t.Context()
	lock := lockTable(t, s, s.names.table)
	tr.reset()
	var wg sync.WaitGroup
	first := make(chan error, 1)
	wg.Go(func() {
		_, err := s.Claim(ctx, claimReq(fmt.Sprintf("first-%d", time.Now().UnixNano()), time.Minute))
		first <- err
	})
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.running == 1 })
	results := make([]batchResult, len(keys))
	for i := range keys {
		c := ctx
		if ctxOf != nil {
			c = ctxOf(i)
		}
		wg.Go(func() {
			res, err := s.Claim(c, reqOf(i))
			results[i] = batchResult{res, err}
		})
	}
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == len(keys) })
	withdrawn := 0
	for _, fn := range between {
		fn()
		waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) < len(keys) })
		withdrawn = 1
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := <-first; err != nil {
		t.Errorf("first claim: %v", err)
	}
	failed := takeFailed(b)
	if wantFailed := slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(k, "\x00") }); (failed == 1) != wantFailed || failed > 1 {
		t.Errorf("%d batched statements failed, want %d", failed, map[bool]int{true: 1}[wantFailed])
	}
	sqls, _ := tr.snapshot()
	batched := 0
	for _, q := range sqls {
		if marker(q) {
			batched++
		}
	}
	if want := 1; len(keys)-withdrawn > 1 && batched != want {
		t.Errorf("%d batched statements for %d queued claims, want %d; statements: %q", batched, len(keys)-withdrawn, want, sqls)
	}
	return results
}

// lockTable holds a SHARE lock on table in a transaction of its own: every
// write to it waits until the caller rolls the transaction back (at the
// latest when the test ends).
func lockTable(t *testing.T, s *Store, table string) pgx.Tx {
	t.Helper()
	ctx := t.Context()
	lock, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Rollback(context.WithoutCancel(ctx)) })
	if _, err := lock.Exec(ctx, "LOCK TABLE "+table+" IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	return lock
}

// takeFailed returns and resets b's count of failed batch statements.
func takeFailed[P batchItem](b *batcher[P]) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.failed
	b.failed = 0
	return n
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

// setMix makes m's estimate all existing keys (a retry storm: the claim
// function first) or all new ones (the insert first).
func setMix(m *storekit.ClaimMix, existing bool) {
	for range 300 {
		m.Observe(existing)
	}
}

// TestClaimRidesWithCompletes: in plain mode a new key's insert queued
// beside a complete goes in the complete's pipeline, one transaction and
// one commit for both, and each gets its own answer.
func TestClaimRidesWithCompletes(t *testing.T) {
	t.Parallel()
	s, tr := tracedStore(t, 0, withBatchLimit(1))
	ctx := t.Context()
	ownedCtx, owned := mustClaim(t, s, claimReq("owned", time.Minute))

	lock := lockTable(t, s, s.names.table)
	tr.reset()
	b := &s.writes
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := s.Claim(ctx, claimReq("warm", time.Minute)); err != nil {
			t.Errorf("warm-up claim: %v", err)
		}
	})
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.running == 1 })
	var completed error
	wg.Go(func() {
		completed = s.Complete(ownedCtx, owned, storekit.StoredResponse{Status: 201, Body: []byte("paid")})
	})
	claims := make([]batchResult, 2)
	for i, k := range []string{"new1", "new2"} {
		wg.Go(func() {
			res, err := s.Claim(ctx, claimReq(k, time.Minute))
			claims[i] = batchResult{res, err}
		})
	}
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == 3 })
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	sqls, _ := tr.snapshot()
	claim, complete := short(s.sql.claimNew), short(s.sql.completeTx)
	pipelines := 0
	for _, q := range sqls {
		if strings.HasPrefix(q, "batch: ") && strings.Count(q, claim) == 2 && strings.Count(q, complete) == 1 {
			pipelines++
		}
	}
	if pipelines != 1 {
		t.Errorf("%d pipelines carried both claims and the complete, want 1; statements: %q", pipelines, sqls)
	}
	if completed != nil {
		t.Errorf("complete beside the claims: %v", completed)
	}
	if got, err := s.Get(ctx, "tenant", "owned"); err != nil || got.Status != storekit.StatusCompleted || string(got.Response.Body) != "paid" {
		t.Errorf("completed record: %+v, %v", got, err)
	}
	for i, k := range []string{"new1", "new2"} {
		r := claims[i]
		if r.err != nil || !r.res.Claimed || !r.res.Fresh {
			t.Errorf("claim %s beside a complete: %+v, %v; want a fresh claim", k, r.res, r.err)
			continue
		}
		if got, err := s.Get(ctx, "tenant", k); err != nil || got.Token != r.res.Record.Token || got.Status != storekit.StatusProcessing {
			t.Errorf("record %s: %+v, %v; the claim answered %+v", k, got, err, r.res.Record)
		}
	}
}
