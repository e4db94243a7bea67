package pgstore

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// twoStores returns two stores on two separate pools (two "instances")
// sharing one schema.
func twoStores(t *testing.T, opts ...Option) (*Store, *Store) {
	t.Helper()
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 5
	p1 := pgstoretest.NewPool(t, cfg)
	cfg2 := pgstoretest.Config(t)
	cfg2.MaxConns = 5
	p2 := pgstoretest.NewPool(t, cfg2)
	schema := pgstoretest.Schema(t, p1)
	opts = append([]Option{WithSchema(schema)}, opts...)
	return openStore(t, p1, opts...), openStore(t, p2, opts...)
}

// TestTwoPoolsOneClaim: 200 concurrent claims of one key, split across two
// stores on separate pools: exactly one is claimed; every other sees the
// winner's processing record. In the "function_first" cases the second
// store calls the claim function first (as a store does during a retry
// storm): its function and the first store's bare insert race for the
// same key.
func TestTwoPoolsOneClaim(t *testing.T) {
	type clusterCase struct {
		name     string
		opts     []Option // both stores
		bOptions []Option // the second store's own
	}
	var cases []clusterCase
	for _, m := range modes {
		cases = append(cases,
			clusterCase{m.name, m.opts, nil},
			clusterCase{m.name + "/function_first", m.opts, []Option{withFunctionFirst()}})
	}
	for _, m := range cases {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			a, b := twoStores(t, m.opts...)
			if m.bOptions != nil {
				b = openStore(t, b.pool, append(append([]Option{WithSchema(b.cfg.schema)}, m.opts...), m.bOptions...)...)
			}
			req := claimReq("same-key", time.Minute)
			const n = 200
			var (
				wg      sync.WaitGroup
				start   = make(chan struct{})
				claimed atomic.Int64
				tokens  sync.Map
			)
			for i := range n {
				s := a
				if i%2 == 1 {
					s = b
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					res, err := s.Claim(t.Context(), req)
					if err != nil {
						t.Errorf("claim: %v", err)
						return
					}
					if res.Claimed {
						claimed.Add(1)
					}
					if res.Record.Status != storekit.StatusProcessing {
						t.Errorf("claim saw status %s", res.Record.Status)
					}
					tokens.Store(res.Record.Token, true)
				}()
			}
			began := time.Now()
			close(start)
			wg.Wait()
			t.Logf("%d concurrent claims took %v", n, time.Since(began))
			if got := claimed.Load(); got != 1 {
				t.Fatalf("%d claims succeeded, want exactly 1", got)
			}
			distinct := 0
			tokens.Range(func(any, any) bool { distinct++; return true })
			if distinct != 1 {
				t.Fatalf("claimers saw %d distinct tokens, want 1", distinct)
			}
		})
	}
}

// TestTwoEnginesOneExecution is the engine-level version: two engines, each
// on its own pool, 200 identical concurrent requests split across them, in
// transactional mode: the handler runs exactly once, one ledger row exists,
// and every other request is either a replay of it or a 409.
func TestTwoEnginesOneExecution(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			a, b := twoStores(t, m.opts...)
			table := ledger(t, a)
			engines := make([]*core.Engine, 2)
			for i, s := range []*Store{a, b} {
				e, err := core.New(s, core.WithLease(5*time.Second), core.WithSharedKeySpace())
				if err != nil {
					t.Fatalf("core.New: %v", err)
				}
				engines[i] = e
			}
			body := []byte(`{"amount":1000,"currency":"JPY","to":"alice"}`)
			const n = 200
			var (
				wg                    sync.WaitGroup
				start                 = make(chan struct{})
				runs, replays, reject atomic.Int64
			)
			for i := range n {
				e := engines[i%2]
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ctx := t.Context()
					d, err := e.Decide(ctx, core.Request{
						Method: http.MethodPost, Route: "/v1/payments", Scope: "user-1",
						Header: http.Header{"Idempotency-Key": {`"pay-1"`}},
						Body:   bytes.NewReader(body),
					})
					if err != nil {
						t.Errorf("decide: %v", err)
						return
					}
					switch d.Outcome {
					case core.Proceed:
						runs.Add(1)
						hctx := d.Context(ctx)
						if err := handle(hctx, table, "pay-1"); err != nil {
							t.Errorf("handler: %v", err)
							_ = e.Abort(ctx, d, err)
							return
						}
						time.Sleep(50 * time.Millisecond) // keep it in flight a while
						if err := e.Commit(ctx, d, adapterkit.Response{Status: 201, Body: []byte(`{"id":"p1"}`)}); err != nil {
							t.Errorf("commit: %v", err)
						}
					case core.Replay:
						replays.Add(1)
					case core.Reject:
						if d.Response.Status != http.StatusConflict {
							t.Errorf("reject with status %d, want 409", d.Response.Status)
						}
						reject.Add(1)
					default:
						t.Errorf("outcome %v", d.Outcome)
					}
				}()
			}
			close(start)
			wg.Wait()
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", runs.Load())
			}
			if got := ledgerRows(t, a, table, "pay-1"); len(got) != 1 {
				t.Fatalf("ledger rows %v, want 1", got)
			}
			// A retry after the fact replays.
			d, err := engines[1].Decide(context.Background(), core.Request{
				Method: http.MethodPost, Route: "/v1/payments", Scope: "user-1",
				Header: http.Header{"Idempotency-Key": {`"pay-1"`}},
				Body:   bytes.NewReader(body),
			})
			if err != nil || d.Outcome != core.Replay || d.Response.Status != 201 {
				t.Fatalf("retry: %+v, %v; want replay of 201", d, err)
			}
			t.Logf("runs=%d replays=%d 409s=%d", runs.Load(), replays.Load(), reject.Load())
		})
	}
}
