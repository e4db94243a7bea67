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
