package pgstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

// pendingCompletes is the test's view of requests whose completes queue:
// each is a claimed key with its handler context (Defer statements queued
// or not) and what its Complete returned.
type pendingCompletes struct {
	keys []string
	ctxs []context.Context
	fs   []storekit.Fence
	errs []error
}

func (pc *pendingCompletes) add(ctx context.Context, key string, f storekit.Fence) {
	pc.keys, pc.ctxs, pc.fs = append(pc.keys, key), append(pc.ctxs, ctx), append(pc.fs, f)
}

// completeRound blocks updates of s's records with a SHARE lock, sends a
// warm-up complete (it takes the running slot and waits on the lock),
// queues pc's completes, runs between (if not nil) once all are queued,
// releases the lock, runs after (if not nil) and waits for every answer.
// It returns how many batch pipelines carried two or more completes.
func completeRound(t *testing.T, s *Store, tr *countingTracer, pc *pendingCompletes, between, after func()) int {
	t.Helper()
	ctx := t.Context()
	warm := claimReq("warm-"+time.Now().Format("150405.000000000"), time.Minute)
	wctx, wf := mustClaim(t, s, warm)
	lock := lockTable(t, s, s.names.table)
	tr.reset()
	b := &s.writes
	var wg sync.WaitGroup
	first := make(chan error, 1)
	wg.Go(func() { first <- s.Complete(wctx, wf, storekit.StoredResponse{Status: 201}) })
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.running == 1 })
	pc.errs = make([]error, len(pc.keys))
	for i := range pc.keys {
		wg.Go(func() {
			pc.errs[i] = s.Complete(pc.ctxs[i], pc.fs[i], storekit.StoredResponse{Status: 201, Body: []byte("ok " + pc.keys[i])})
		})
	}
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == len(pc.keys) })
	if between != nil {
		between()
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if after != nil {
		after()
	}
	wg.Wait()
	if err := <-first; err != nil {
		t.Errorf("warm-up complete: %v", err)
	}
	sqls, _ := tr.snapshot()
	batches, marker := 0, short(s.sql.completeTx) // as the tracer shows a batch's statement
	for _, q := range sqls {
		if strings.HasPrefix(q, "batch: ") && strings.Count(q, marker) >= 2 {
			batches++
		}
	}
	return batches
}

// TestCompleteBatch: completes that queue behind one in flight travel in
// one pipeline, each request's Defer statements with its own fenced
// complete, and each gets the answer its own complete would have got:
// deferred rows and responses committed, a plain complete (no Defer)
// too, one record marked as waited for among them.
func TestCompleteBatch(t *testing.T) {
	for _, v := range batchVariants() {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			s, tr := tracedStore(t, v.execMode, append([]Option{withBatchLimit(1)}, v.opts...)...)
			table := ledger(t, s)
			ctx := t.Context()

			pc := &pendingCompletes{}
			for _, k := range []string{"d3", "d1", "plain", "d2"} {
				hctx, f := mustClaim(t, s, claimReq(k, time.Minute))
				if k != "plain" {
					if err := deferRow(hctx, table, k); err != nil {
						t.Fatal(err)
					}
					// Order within a request is kept across the batch.
					if err := Defer(hctx, "UPDATE "+table+" SET token = token * 10 WHERE key = $1", k); err != nil {
						t.Fatal(err)
					}
				}
				pc.add(hctx, k, f)
			}
			// A waiter marked "d2" (its complete reads the flag back).
			if _, err := s.pool.Exec(ctx, "UPDATE "+s.names.table+" SET waiters = true WHERE key = 'd2'"); err != nil {
				t.Fatal(err)
			}
			if n := completeRound(t, s, tr, pc, nil, nil); n != 1 {
				t.Errorf("%d batch pipelines for %d queued completes, want 1", n, len(pc.keys))
			}
			if n := takeFailed(&s.writes); n != 0 {
				t.Errorf("%d batch statements failed, want 0", n)
			}
			for i, k := range pc.keys {
				if pc.errs[i] != nil {
					t.Errorf("complete %s: %v", k, pc.errs[i])
					continue
				}
				rec, err := s.Get(ctx, "tenant", k)
				if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || string(rec.Response.Body) != "ok "+k {
					t.Errorf("record %s = %+v, %v; want completed with its own response", k, rec, err)
				}
				want := []int64{pc.fs[i].Token * 10}
				if k == "plain" {
					want = nil
				}
				if got := ledgerRows(t, s, table, k); !slices.Equal(got, want) {
					t.Errorf("ledger %s = %v, want %v", k, got, want)
				}
			}
		})
	}
}

// TestCompleteBatchIsolation: a batch PostgreSQL refuses (one request's
// deferred statement raises; another's lease was taken over) is sent again
// request by request: only those two fail, each as alone (ErrNotCommitted
// and released; ErrLeaseLost and nothing written), and the others commit.
// A complete whose context ends while it queues leaves the queue: nothing
// of it runs and its record stays the owner's.
func TestCompleteBatchIsolation(t *testing.T) {
	t.Parallel()
	s, tr := tracedStore(t, 0, withBatchLimit(1))
	table := ledger(t, s)
	ctx := t.Context()

	pc := &pendingCompletes{}
	for _, k := range []string{"ok1", "bad", "stale", "ok2"} {
		lease := time.Minute
		if k == "stale" {
			lease = 300 * time.Millisecond
		}
		req := claimReq(k, lease)
		hctx, f := mustClaim(t, s, req)
		if err := deferRow(hctx, table, k); err != nil {
			t.Fatal(err)
		}
		switch k {
		case "bad":
			if err := Defer(hctx, "SELECT 1 / (count(*) - count(*)) FROM "+table); err != nil {
				t.Fatal(err)
			}
		case "stale":
			waitLapsed(t, s, req, f)
			if res, err := s.Claim(ctx, claimReq(k, time.Minute)); err != nil || !res.Claimed {
				t.Fatalf("takeover: %+v, %v", res, err)
			}
		}
		pc.add(hctx, k, f)
	}
	if n := completeRound(t, s, tr, pc, nil, nil); n != 1 {
		t.Errorf("%d batch pipelines for %d queued completes, want 1", n, len(pc.keys))
	}
	if n := takeFailed(&s.writes); n != 1 {
		t.Errorf("%d batch statements failed, want 1", n)
	}
	for i, k := range pc.keys {
		err := pc.errs[i]
		rows := ledgerRows(t, s, table, k)
		rec, gerr := s.Get(ctx, "tenant", k)
		if gerr != nil {
			t.Fatalf("get %s: %v", k, gerr)
		}
		switch k {
		case "bad":
			if !errors.Is(err, storekit.ErrNotCommitted) || len(rows) != 0 || rec.Status != storekit.StatusFailed {
				t.Errorf("bad: %v, ledger %v, record %s; want ErrNotCommitted, nothing written, released", err, rows, rec.Status)
			}
			if err != nil && strings.Contains(err.Error(), k) {
				t.Errorf("the error carries the key: %v", err)
			}
		case "stale":
			if !errors.Is(err, core.ErrLeaseLost) || len(rows) != 0 || rec.Token == pc.fs[i].Token {
				t.Errorf("stale: %v, ledger %v, record token %d; want ErrLeaseLost, nothing written, the new owner's record", err, rows, rec.Token)
			}
		default:
			if err != nil || len(rows) != 1 || rec.Status != storekit.StatusCompleted {
				t.Errorf("%s beside failing ones: %v, ledger %v, record %s; want completed", k, err, rows, rec.Status)
			}
		}
	}

	// A complete cancelled while it queues.
	pc = &pendingCompletes{}
	cctx, cancel := context.WithCancel(ctx)
	hctx, f := mustClaim(t, s, claimReq("c1", time.Minute))
	pc.add(hctx, "c1", f)
	gone := claimReq("gone", time.Minute)
	res, err := s.Claim(ctx, gone)
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	f = storekit.Fence{Scope: gone.Scope, Key: gone.Key, Token: res.Record.Token}
	pc.add(storetest.ContextWithLease(cctx, storetest.NewLease(s, f)), "gone", f)
	if err := deferRow(pc.ctxs[1], table, "gone"); err != nil {
		t.Fatal(err)
	}
	completeRound(t, s, tr, pc, func() {
		cancel()
		waitFor(t, func() bool { b := &s.writes; b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == 1 })
	}, nil)
	if err := pc.errs[1]; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled complete: %v, want context.Canceled", err)
	}
	if err := pc.errs[0]; err != nil {
		t.Errorf("complete beside a cancelled one: %v", err)
	}
	if rows := ledgerRows(t, s, table, "gone"); len(rows) != 0 {
		t.Errorf("the cancelled complete's deferred row was written: %v", rows)
	}
	if rec, err := s.Get(ctx, "tenant", "gone"); err != nil || rec.Status != storekit.StatusProcessing || rec.Token != pc.fs[1].Token {
		t.Errorf("the cancelled complete's record: %+v, %v; want still its owner's", rec, err)
	}
}

// TestCompleteBatchConnectionKilled: a batch whose connection dies while it
// runs (its backend terminated, here while a deferred insert waits on a
// lock) is sent again request by request, and each request ends as if
// alone: written once, completed, nothing lost and nothing doubled.
func TestCompleteBatchConnectionKilled(t *testing.T) {
	t.Parallel()
	s, tr := tracedStore(t, 0, withBatchLimit(1))
	table := ledger(t, s)
	ctx := t.Context()

	pc := &pendingCompletes{}
	for _, k := range []string{"u1", "u2", "u3"} {
		hctx, f := mustClaim(t, s, claimReq(k, time.Minute))
		if err := deferRow(hctx, table, k); err != nil {
			t.Fatal(err)
		}
		pc.add(hctx, k, f)
	}
	var ledgerLock pgx.Tx
	batches := completeRound(t, s, tr, pc, func() {
		ledgerLock = lockTable(t, s, table)
	}, func() {
		defer func() { _ = ledgerLock.Rollback(ctx) }()
		var pid int32
		waitFor(t, func() bool {
			err := s.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO '||$1||'%'`, table).Scan(&pid)
			return err == nil
		})
		if _, err := s.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
	})
	if batches != 1 {
		t.Errorf("%d batch pipelines for %d queued completes, want 1", batches, len(pc.keys))
	}
	if n := takeFailed(&s.writes); n != 1 {
		t.Errorf("%d batch statements failed, want 1 (the killed one)", n)
	}
	for i, k := range pc.keys {
		if pc.errs[i] != nil {
			t.Errorf("complete %s after its batch was killed: %v", k, pc.errs[i])
		}
		if rows := ledgerRows(t, s, table, k); len(rows) != 1 || rows[0] != pc.fs[i].Token {
			t.Errorf("ledger %s = %v, want [%d]", k, rows, pc.fs[i].Token)
		}
		if rec, err := s.Get(ctx, "tenant", k); err != nil || rec.Status != storekit.StatusCompleted {
			t.Errorf("record %s = %+v, %v; want completed", k, rec, err)
		}
	}
}
