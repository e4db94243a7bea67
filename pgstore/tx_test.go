package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// ledger creates the business table the handler-equivalents write to.
func ledger(t *testing.T, s *Store) string {
	t.Helper()
	name := pgx.Identifier{s.cfg.schema, "ledger"}.Sanitize()
	// Deliberately no unique constraint on key: a double execution must
	// show up as two rows, not be hidden by a constraint violation.
	if _, err := s.pool.Exec(t.Context(), "CREATE TABLE "+name+" (id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL)"); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	return name
}

func ledgerRows(t *testing.T, s *Store, table, key string) []int64 {
	t.Helper()
	rows, err := s.pool.Query(t.Context(), "SELECT token FROM "+table+" WHERE key = $1 ORDER BY id", key)
	if err != nil {
		t.Fatalf("read ledger: %v", err)
	}
	toks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("read ledger: %v", err)
	}
	return toks
}

func claimReq(key string, lease time.Duration) storekit.ClaimRequest {
	return storekit.ClaimRequest{
		Scope: "tenant", Key: key, Method: "POST", Route: "/v1/payments",
		Fingerprint: "f00d", Lease: lease, Retention: time.Hour,
	}
}

// handle is a handler-equivalent: it writes one ledger row in the lease's
// transaction.
func handle(ctx context.Context, table, key string) error {
	tx, err := Tx(ctx)
	if err != nil {
		return err
	}
	l, _ := storekit.LeaseFromContext(ctx)
	_, err = tx.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, l.Fence().Token)
	return err
}

func mustClaim(t *testing.T, s *Store, req storekit.ClaimRequest) (context.Context, storekit.Fence) {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if !res.Claimed {
		t.Fatalf("claim: not claimed: %+v", res.Record)
	}
	f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	ctx := storetest.ContextWithLease(t.Context(), storetest.NewLease(s, f))
	// If the test stops early, roll back a transaction it left open: the
	// pool could not close otherwise. A no-op after Complete or Fail.
	t.Cleanup(func() { s.abandonTx(context.WithoutCancel(ctx), f) })
	return ctx, f
}

func TestTxCommitIsAtomicWithRecord(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, pgstoretest.Pool(t), m.opts...)
			table := ledger(t, s)
			req := claimReq("k1", time.Minute)
			ctx, f := mustClaim(t, s, req)

			tx1, err := Tx(ctx)
			if err != nil {
				t.Fatalf("Tx: %v", err)
			}
			tx2, err := Tx(ctx)
			if err != nil {
				t.Fatalf("Tx (second): %v", err)
			}
			if tx1.Conn() != tx2.Conn() {
				t.Fatalf("Tx twice returned different transactions")
			}
			if err := handle(ctx, table, req.Key); err != nil {
				t.Fatalf("handler: %v", err)
			}
			if err := tx1.Commit(ctx); !errors.Is(err, ErrTxOwned) {
				t.Fatalf("handler Commit = %v, want ErrTxOwned", err)
			}
			if err := tx1.Rollback(ctx); !errors.Is(err, ErrTxOwned) {
				t.Fatalf("handler Rollback = %v, want ErrTxOwned", err)
			}
			// Not visible outside the transaction before Complete.
			if got := ledgerRows(t, s, table, req.Key); len(got) != 0 {
				t.Fatalf("ledger visible before commit: %v", got)
			}
			if err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")}); err != nil {
				t.Fatalf("complete: %v", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != f.Token {
				t.Fatalf("ledger after commit = %v, want [%d]", got, f.Token)
			}
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || string(rec.Response.Body) != "ok" {
				t.Fatalf("record after commit = %+v, %v", rec, err)
			}
			if _, err := Tx(ctx); !errors.Is(err, ErrLeaseFinished) {
				t.Fatalf("Tx after Complete = %v, want ErrLeaseFinished", err)
			}
			if st := s.pool.Stat(); st.AcquiredConns() != 0 {
				t.Fatalf("%d connections still acquired after Complete", st.AcquiredConns())
			}
		})
	}
}

func TestTxFailRollsBack(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, pgstoretest.Pool(t), m.opts...)
			table := ledger(t, s)
			req := claimReq("k1", time.Minute)
			ctx, f := mustClaim(t, s, req)
			if err := handle(ctx, table, req.Key); err != nil {
				t.Fatalf("handler: %v", err)
			}
			if err := s.Fail(ctx, f); err != nil {
				t.Fatalf("fail: %v", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 0 {
				t.Fatalf("ledger after Fail = %v, want none", got)
			}
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			if err != nil || rec.Status != storekit.StatusFailed {
				t.Fatalf("record after Fail = %+v, %v", rec, err)
			}
			if st := s.pool.Stat(); st.AcquiredConns() != 0 {
				t.Fatalf("%d connections still acquired after Fail", st.AcquiredConns())
			}
			// Retryable: the same request takes over and its write lands.
			ctx2, f2 := mustClaim(t, s, req)
			if err := handle(ctx2, table, req.Key); err != nil {
				t.Fatalf("handler (retry): %v", err)
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

func TestTxOutsideHandler(t *testing.T) {
	if _, err := Tx(context.Background()); !errors.Is(err, ErrNoLease) {
		t.Fatalf("Tx without lease = %v, want ErrNoLease", err)
	}
	// A lease granted by another store.
	ctx := storetest.ContextWithLease(context.Background(), storetest.NewLease(otherStore{}, storekit.Fence{Key: "k"}))
	if _, err := Tx(ctx); err == nil {
		t.Fatalf("Tx with a foreign store's lease succeeded")
	}
}

type otherStore struct{ core.Store }

// wrappedStore is a decorator (metrics, tracing) that exposes its store.
type wrappedStore struct{ core.Store }

func (w wrappedStore) Unwrap() core.Store { return w.Store }

// TestTxThroughDecorator: an engine whose store is a decorator around
// pgstore still gets transactional mode, and the decorator's Complete (which
// calls the inner store with the same context) commits the transaction.
func TestTxThroughDecorator(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	w := wrappedStore{s}
	req := claimReq("k", time.Minute)
	res, err := w.Claim(t.Context(), req)
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	ctx := storetest.ContextWithLease(t.Context(), storetest.NewLease(w, f))
	t.Cleanup(func() { s.abandonTx(context.WithoutCancel(ctx), f) })
	if err := handle(ctx, table, "k"); err != nil {
		t.Fatalf("handler through decorator: %v", err)
	}
	if err := w.Complete(ctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if got := ledgerRows(t, s, table, "k"); len(got) != 1 {
		t.Fatalf("ledger = %v, want the row committed with the record", got)
	}
}

// TestTxStaleOwnerWritesVanish: the owner's lease lapses, a retry takes the
// key over and commits; the stale owner's Complete fails with ErrLeaseLost
// and its business write is gone.
func TestTxStaleOwnerWritesVanish(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, pgstoretest.Pool(t), m.opts...)
			table := ledger(t, s)
			req := claimReq("k1", 200*time.Millisecond)

			staleCtx, staleFence := mustClaim(t, s, req)
			if err := handle(staleCtx, table, req.Key); err != nil {
				t.Fatalf("stale handler: %v", err)
			}
			// The stale owner stalls (no heartbeat) past its lease.
			time.Sleep(300 * time.Millisecond)
			newCtx, newFence := mustClaim(t, s, req)
			if newFence.Token <= staleFence.Token {
				t.Fatalf("takeover token %d not above %d", newFence.Token, staleFence.Token)
			}
			if err := handle(newCtx, table, req.Key); err != nil {
				t.Fatalf("new handler: %v", err)
			}
			// Stale owner wakes up first and tries to commit: refused.
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
			rec, err := s.Get(t.Context(), req.Scope, req.Key)
			if err != nil || string(rec.Response.Body) != "new" {
				t.Fatalf("record = %+v, %v; want the new owner's response", rec, err)
			}
		})
	}
}

// TestTxStaleOwnerCommitsFirst: the stale owner's lease lapsed but nobody took
// over yet, so it still owns the record and commits; the late claimer then
// sees the completed record.
func TestTxStaleOwnerCommitsBeforeTakeover(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	table := ledger(t, s)
	req := claimReq("k1", 100*time.Millisecond)
	ctx, f := mustClaim(t, s, req)
	if err := handle(ctx, table, req.Key); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("Complete after lapse without takeover: %v", err)
	}
	res, err := s.Claim(t.Context(), req)
	if err != nil || res.Claimed || res.Record.Status != storekit.StatusCompleted {
		t.Fatalf("claim after commit = %+v, %v", res, err)
	}
	if got := ledgerRows(t, s, table, req.Key); len(got) != 1 {
		t.Fatalf("ledger = %v", got)
	}
}

// TestTxInterleavings throws many concurrent executions with short leases
// and random stalls at a few keys; whatever the interleaving, every key ends
// completed with exactly one ledger row, written by the token that
// completed it.
func TestTxInterleavings(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgstoretest.Config(t)
			cfg.MaxConns = 12
			pool := pgstoretest.NewPool(t, cfg)
			s := newStore(t, pool, m.opts...)
			table := ledger(t, s)
			runInterleavings(t, s, table, 6, 8, 50*time.Millisecond)
		})
	}
}

func runInterleavings(t *testing.T, s *Store, table string, keys, workers int, lease time.Duration) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var (
		wg                       sync.WaitGroup
		commits, lost, conflicts atomic.Int64
		mu                       sync.Mutex
		completedBy              = map[string]int64{}
	)
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(k), uint64(w)))
				req := claimReq(key, lease)
				for ctx.Err() == nil {
					res, err := s.Claim(ctx, req)
					if err != nil {
						t.Errorf("claim %s: %v", key, err)
						return
					}
					if res.Record.Status == storekit.StatusCompleted {
						return
					}
					if !res.Claimed {
						conflicts.Add(1)
						time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
						continue
					}
					f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
					hctx := storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
					if err := handle(hctx, table, key); err != nil {
						t.Errorf("handler %s: %v", key, err)
						return
					}
					// Stall: sometimes past the lease (a takeover may
					// happen), sometimes not.
					time.Sleep(time.Duration(rng.IntN(int(2*lease/time.Millisecond))) * time.Millisecond)
					switch rng.IntN(4) {
					case 0: // handler failed: abort
						if err := s.Fail(hctx, f); err != nil && !errors.Is(err, core.ErrLeaseLost) {
							t.Errorf("fail %s: %v", key, err)
							return
						}
					default:
						err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte(fmt.Sprint(f.Token))})
						switch {
						case err == nil:
							commits.Add(1)
							mu.Lock()
							if prev, ok := completedBy[key]; ok {
								t.Errorf("%s completed twice: tokens %d and %d", key, prev, f.Token)
							}
							completedBy[key] = f.Token
							mu.Unlock()
							return
						case errors.Is(err, core.ErrLeaseLost):
							lost.Add(1)
						default:
							t.Errorf("complete %s: %v", key, err)
							return
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("interleavings did not finish: %v", ctx.Err())
	}
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		rec, err := s.Get(t.Context(), "tenant", key)
		if err != nil || rec.Status != storekit.StatusCompleted {
			t.Errorf("%s: record %+v, %v; want completed", key, rec, err)
			continue
		}
		rows := ledgerRows(t, s, table, key)
		if len(rows) != 1 || rows[0] != rec.Token || completedBy[key] != rec.Token {
			t.Errorf("%s: ledger rows %v, record token %d, completed by %d; want exactly one row by the completing token",
				key, rows, rec.Token, completedBy[key])
		}
	}
	if st := s.pool.Stat(); st.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired", st.AcquiredConns())
	}
	t.Logf("commits=%d lease-lost=%d in-flight-conflicts=%d", commits.Load(), lost.Load(), conflicts.Load())
	if lost.Load() == 0 {
		t.Logf("note: no stale-owner commit was exercised in this run")
	}
}

// TestTxBeginCancelledReleasesKey: a handler whose context ends (the client
// gone, the lease lost) after its transaction's connection was acquired but
// before BEGIN went out never began a transaction, and wrote nothing: Fail
// releases the key. The idle connection was taken for a transaction the
// handler had ended with SQL, so the record was completed as not retained
// and every retry of a payment that never happened was refused (found by
// TestOutageTerminateBackendsUnderLoad under load: one key of 40 without
// its ledger row).
func TestTxBeginCancelledReleasesKey(t *testing.T) {
	for _, m := range modes {
		for _, then := range []string{"fail", "complete"} {
			t.Run(m.name+"/"+then, func(t *testing.T) {
				t.Parallel()
				var cancelOnAcquire atomic.Pointer[context.CancelFunc]
				cfg := pgstoretest.Config(t)
				cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
					if c := cancelOnAcquire.Load(); c != nil {
						(*c)() // the handler's context ends as its connection is handed out
					}
					return true, nil
				}
				s := newStore(t, pgstoretest.NewPool(t, cfg), m.opts...)
				table := ledger(t, s)
				req := claimReq("k1", time.Minute)
				ctx, f := mustClaim(t, s, req)
				hctx, cancel := context.WithCancel(ctx)
				cancelOnAcquire.Store(&cancel)
				err := handle(hctx, table, req.Key)
				cancelOnAcquire.Store(nil)
				if err == nil {
					t.Fatal("the handler's statement ran on a cancelled context")
				}
				if then == "fail" {
					if err := s.Fail(ctx, f); err != nil {
						t.Fatalf("Fail: %v", err)
					}
				} else if err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("paid")}); !errors.Is(err, storekit.ErrNotCommitted) {
					// The handler ignored the error and answered: its
					// write did not land, so the answer must not be kept.
					t.Fatalf("Complete = %v, want ErrNotCommitted", err)
				}
				rec, err := s.Get(t.Context(), req.Scope, req.Key)
				if err != nil {
					t.Fatal(err)
				}
				if rec.Status != storekit.StatusFailed || rec.Response != nil {
					t.Fatalf("record %s, response %+v; want failed (released): the payment never happened", rec.Status, rec.Response)
				}
				if rows := ledgerRows(t, s, table, req.Key); len(rows) != 0 {
					t.Fatalf("ledger %v, want no row", rows)
				}
				res, err := s.Claim(t.Context(), req)
				if err != nil || !res.Claimed {
					t.Fatalf("retry: %+v, %v; want it claimed", res, err)
				}
			})
		}
	}
}
