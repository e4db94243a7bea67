package pgstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// deferRow queues the handler-equivalent's ledger row with Defer.
func deferRow(ctx context.Context, table, key string) error {
	l, _ := storekit.LeaseFromContext(ctx)
	return Defer(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, l.Fence().Token)
}

func deferModes() []struct {
	name string
	opts []Option
} {
	return append(modes[:len(modes):len(modes)], struct {
		name string
		opts []Option
	}{"transactional", []Option{WithTransactional()}})
}

// TestDeferCommitsWithRecord: deferred statements run at Complete, in the
// order queued, in one transaction with the stored response; nothing runs
// before, and no connection stays acquired.
func TestDeferCommitsWithRecord(t *testing.T) {
	for _, m := range deferModes() {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, pgstoretest.Pool(t), m.opts...)
			table := ledger(t, s)
			req := claimReq("k1", time.Minute)
			ctx, f := mustClaim(t, s, req)
			if err := deferRow(ctx, table, req.Key); err != nil {
				t.Fatalf("Defer: %v", err)
			}
			// The second statement sees the first: order is kept, in one
			// transaction.
			if err := Defer(ctx, "UPDATE "+table+" SET token = token * 10 WHERE key = $1", req.Key); err != nil {
				t.Fatalf("Defer (second): %v", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 0 {
				t.Fatalf("deferred row visible before Complete: %v", got)
			}
			if st := s.pool.Stat(); st.AcquiredConns() != 0 {
				t.Fatalf("Defer acquired %d connections", st.AcquiredConns())
			}
			if err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
				t.Fatalf("complete: %v", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != f.Token*10 {
				t.Fatalf("ledger after Complete = %v, want [%d]", got, f.Token*10)
			}
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			if err != nil || rec.Status != storekit.StatusCompleted || string(rec.Response.Body) != "ok" {
				t.Fatalf("record = %+v, %v", rec, err)
			}
			if st := s.pool.Stat(); st.AcquiredConns() != 0 {
				t.Fatalf("%d connections still acquired after Complete", st.AcquiredConns())
			}
			if err := Defer(ctx, "SELECT 1"); !errors.Is(err, ErrLeaseFinished) {
				t.Fatalf("Defer after Complete = %v, want ErrLeaseFinished", err)
			}
		})
	}
}

// TestDeferAfterTx: with a transaction begun through Tx, the deferred
// statements run in it, after the handler's statements, and commit with
// them and the record.
func TestDeferAfterTx(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	req := claimReq("k1", time.Minute)
	ctx, f := mustClaim(t, s, req)
	// Queued before the Tx statement, run after it: it updates that row.
	if err := Defer(ctx, "UPDATE "+table+" SET token = -token WHERE key = $1", req.Key); err != nil {
		t.Fatal(err)
	}
	if err := handle(ctx, table, req.Key); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != -f.Token {
		t.Fatalf("ledger = %v, want [%d] (the Tx row, updated by the deferred statement)", got, -f.Token)
	}
	if st := s.pool.Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired", st.AcquiredConns())
	}
}

// TestDeferNotRunOnFail: a released key runs none of its deferred
// statements, and its retry queues its own.
func TestDeferNotRunOnFail(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	req := claimReq("k1", time.Minute)
	ctx, f := mustClaim(t, s, req)
	if err := deferRow(ctx, table, req.Key); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, f); err != nil {
		t.Fatalf("fail: %v", err)
	}
	if got := ledgerRows(t, s, table, req.Key); len(got) != 0 {
		t.Fatalf("ledger after Fail = %v, want none", got)
	}
	ctx2, f2 := mustClaim(t, s, req)
	if err := deferRow(ctx2, table, req.Key); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx2, f2, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete (retry): %v", err)
	}
	if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != f2.Token {
		t.Fatalf("ledger after retry = %v, want [%d]", got, f2.Token)
	}
}

// TestDeferFailureRollsBackEverything: a deferred statement PostgreSQL
// refuses rolls back the other deferred statements, the Tx writes and the
// response; Complete says so with storekit.ErrNotCommitted and releases the
// key, so a retry runs again at once.
func TestDeferFailureRollsBackEverything(t *testing.T) {
	for _, withTx := range []bool{false, true} {
		name := map[bool]string{false: "deferred only", true: "after Tx"}[withTx]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, pgstoretest.Pool(t))
			table := ledger(t, s)
			req := claimReq("k1", time.Hour)
			ctx, f := mustClaim(t, s, req)
			if withTx {
				if err := handle(ctx, table, req.Key); err != nil {
					t.Fatal(err)
				}
			}
			if err := deferRow(ctx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			if err := Defer(ctx, "SELECT 1 / (count(*) - count(*)) FROM "+table); err != nil {
				t.Fatal(err)
			}
			err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("never")})
			if !errors.Is(err, storekit.ErrNotCommitted) {
				t.Fatalf("Complete = %v, want ErrNotCommitted", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 0 {
				t.Fatalf("ledger = %v, want nothing committed", got)
			}
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			if err != nil || rec.Status != storekit.StatusFailed {
				t.Fatalf("record = %+v, %v; want failed (released)", rec, err)
			}
			if st := s.pool.Stat(); st.AcquiredConns() != 0 {
				t.Fatalf("%d connections still acquired", st.AcquiredConns())
			}
			// Released, not held for the hour's lease: the retry claims.
			ctx2, f2 := mustClaim(t, s, req)
			if err := deferRow(ctx2, table, req.Key); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx2, f2, storekit.StoredResponse{Status: 201}); err != nil {
				t.Fatalf("complete (retry): %v", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != f2.Token {
				t.Fatalf("ledger after retry = %v, want [%d]", got, f2.Token)
			}
		})
	}
}

// TestDeferStaleOwnerWritesVanish: an owner whose lease was taken over
// completes with ErrLeaseLost and its deferred statements never commit.
func TestDeferStaleOwnerWritesVanish(t *testing.T) {
	for _, m := range deferModes() {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, pgstoretest.Pool(t), m.opts...)
			table := ledger(t, s)
			req := claimReq("k1", 200*time.Millisecond)
			staleCtx, staleFence := mustClaim(t, s, req)
			if err := deferRow(staleCtx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			waitLapsed(t, s, req, staleFence)
			newCtx, newFence := mustClaim(t, s, req)
			if err := deferRow(newCtx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			err := s.Complete(staleCtx, staleFence, storekit.StoredResponse{Status: 201, Body: []byte("stale")})
			if !errors.Is(err, core.ErrLeaseLost) {
				t.Fatalf("stale Complete = %v, want ErrLeaseLost", err)
			}
			if err := s.Complete(newCtx, newFence, storekit.StoredResponse{Status: 201, Body: []byte("new")}); err != nil {
				t.Fatalf("new Complete: %v", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != newFence.Token {
				t.Fatalf("ledger = %v, want exactly the new owner's row [%d]", got, newFence.Token)
			}
		})
	}
}

// waitLapsed waits until the database's clock is past f's lease.
func waitLapsed(t *testing.T, s *Store, req storekit.ClaimRequest, f storekit.Fence) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var lapsed bool
		err := s.pool.QueryRow(t.Context(), "SELECT locked_until <= now() FROM "+s.names.table+" WHERE scope = $1 AND key = $2 AND token = $3",
			req.Scope, req.Key, f.Token).Scan(&lapsed)
		if err != nil {
			t.Fatalf("read lease: %v", err)
		}
		if lapsed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("lease did not lapse within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDeferRefusals: no lease, a foreign store's lease, query options.
func TestDeferRefusals(t *testing.T) {
	if err := Defer(context.Background(), "SELECT 1"); !errors.Is(err, ErrNoLease) {
		t.Fatalf("Defer without lease = %v, want ErrNoLease", err)
	}
	ctx := storetest.ContextWithLease(context.Background(), storetest.NewLease(otherStore{}, storekit.Fence{Key: "k"}))
	if err := Defer(ctx, "SELECT 1"); err == nil {
		t.Fatal("Defer with a foreign store's lease succeeded")
	}
	s := newStore(t, pgstoretest.Pool(t))
	ctx, _ = mustClaim(t, s, claimReq("k1", time.Minute))
	if err := Defer(ctx, "SELECT $1", pgx.QueryExecModeSimpleProtocol, 1); err == nil {
		t.Fatal("Defer with a query option succeeded")
	}
}

// TestDeferThroughEngine: through Engine.Call, a failing deferred statement
// fails the call with ErrNotCommitted and the next call runs fn again; a
// succeeding one commits exactly once however many callers race.
func TestDeferThroughEngine(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	e, err := core.New(s)
	if err != nil {
		t.Fatal(err)
	}
	req := core.CallRequest{Scope: "tenant", Key: "pay-1", Name: "charge", Input: []byte("42")}
	_, err = e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
		if err := deferRow(ctx, table, "pay-1"); err != nil {
			return nil, err
		}
		return []byte("booked"), Defer(ctx, "SELECT 1 / 0")
	})
	if !errors.Is(err, storekit.ErrNotCommitted) {
		t.Fatalf("call with a failing deferred statement = %v, want ErrNotCommitted", err)
	}
	if rows := ledgerRows(t, s, table, "pay-1"); len(rows) != 0 {
		t.Fatalf("ledger = %v after a failed commit", rows)
	}
	var (
		wg   sync.WaitGroup
		runs int64
		mu   sync.Mutex
	)
	for range 8 {
		wg.Go(func() {
			out, err := e.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
				mu.Lock()
				runs++
				mu.Unlock()
				return []byte("booked"), deferRow(ctx, table, "pay-1")
			})
			if err != nil && !errors.Is(err, core.ErrInFlight) {
				t.Errorf("call: %v", err)
			}
			if err == nil && string(out.Value) != "booked" {
				t.Errorf("call result %q", out.Value)
			}
		})
	}
	wg.Wait()
	if rows := ledgerRows(t, s, table, "pay-1"); len(rows) != 1 {
		t.Fatalf("ledger rows %v after %d runs, want exactly 1", rows, runs)
	}
}

// TestDeferExecModes: in every query mode a pool may be configured with
// (the simple protocol sends the batch as one multi-statement query), the
// deferred statements commit with the record, and a stale owner's roll back.
func TestDeferExecModes(t *testing.T) {
	for _, em := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"cache_statement", 0}, {"exec", pgx.QueryExecModeExec}, {"simple_protocol", pgx.QueryExecModeSimpleProtocol}} {
		t.Run(em.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgstoretest.Config(t)
			if em.mode != 0 {
				cfg.ConnConfig.DefaultQueryExecMode = em.mode
			}
			s := newStore(t, pgstoretest.NewPool(t, cfg))
			table := ledger(t, s)
			req := claimReq("k1", 100*time.Millisecond)
			staleCtx, staleFence := mustClaim(t, s, req)
			if err := deferRow(staleCtx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			waitLapsed(t, s, req, staleFence)
			newCtx, newFence := mustClaim(t, s, req)
			if err := deferRow(newCtx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(staleCtx, staleFence, storekit.StoredResponse{Status: 201}); !errors.Is(err, core.ErrLeaseLost) {
				t.Fatalf("stale Complete = %v, want ErrLeaseLost", err)
			}
			if err := s.Complete(newCtx, newFence, storekit.StoredResponse{Status: 201, Body: []byte("new")}); err != nil {
				t.Fatalf("new Complete: %v", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != newFence.Token {
				t.Fatalf("ledger = %v, want exactly the new owner's row [%d]", got, newFence.Token)
			}
		})
	}
}
