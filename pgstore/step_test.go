package pgstore

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// stepEngine is an engine on s for the step tests.
func stepEngine(t *testing.T, s *Store, opts ...core.Option) *core.Engine {
	t.Helper()
	eng, err := core.New(s, append([]core.Option{core.WithStepsRequired(true), core.WithSharedKeySpace()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

func stepRequest(key string) core.Request {
	return core.Request{Method: http.MethodPost, Route: "/v1/payments", Target: "/v1/payments",
		Header: http.Header{"Idempotency-Key": {key}}, Body: strings.NewReader(`{"amount":1000}`)}
}

func stepProceed(t *testing.T, eng *core.Engine, key string) (*core.Decision, context.Context) {
	t.Helper()
	d, err := eng.Decide(t.Context(), stepRequest(key))
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != core.Proceed {
		t.Fatalf("decide %s: %v %+v, want proceed", key, d.Outcome, d.Response)
	}
	t.Cleanup(func() { _ = eng.Abort(context.Background(), d, nil) })
	return d, d.Context(t.Context())
}

// TestStepQueryCounts: a step costs a first execution one statement (the
// fenced insert), nothing else: a fresh claim reports Fresh, so no read of
// steps; a resumed execution reads them once; a resumed step costs nothing.
// For every way the store claims (the function's binary composite, its
// text columns, the bare insert first).
func TestStepQueryCounts(t *testing.T) {
	variants := []struct {
		name     string
		execMode pgx.QueryExecMode
		opts     []Option
	}{
		{"binary", 0, []Option{withFunctionFirst()}},
		{"text", pgx.QueryExecModeExec, []Option{withFunctionFirst()}},
		{"insert_first", 0, nil},
		{"partitioned", 0, []Option{WithPartitioning(2)}},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			tr := &countingTracer{}
			cfg := pgstoretest.Config(t)
			cfg.MaxConns = 2
			cfg.ConnConfig.Tracer = tr
			if v.execMode != 0 {
				cfg.ConnConfig.DefaultQueryExecMode = v.execMode
			}
			pool := pgstoretest.NewPool(t, cfg)
			s := newStore(t, pool, v.opts...)
			eng := stepEngine(t, s, core.WithLease(time.Minute))
			runs := 0
			charge := func(context.Context) ([]byte, error) { runs++; return []byte("ch_1"), nil }
			count := func(name string, want int, fn func() error) {
				t.Helper()
				tr.reset()
				if err := fn(); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if sqls, _ := tr.snapshot(); len(sqls) != want {
					var list []string
					for _, q := range sqls {
						list = append(list, short(q))
					}
					t.Errorf("%s: %d statements, want %d: %q", name, len(sqls), want, list)
				}
			}
			// Warm up: the schema check on the first claim.
			wd, _ := stepProceed(t, eng, "warm")
			if err := eng.Commit(t.Context(), wd, adapterkit.Response{Status: 201}); err != nil {
				t.Fatal(err)
			}

			d, ctx := stepProceed(t, eng, "k1")
			count("first step of a fresh execution (the fenced insert)", 1, func() error {
				_, err := core.Step(ctx, "charge", charge)
				return err
			})
			count("the same step again in the execution", 0, func() error {
				_, err := core.Step(ctx, "charge", charge)
				return err
			})
			if err := eng.Commit(t.Context(), d, adapterkit.Response{Status: http.StatusBadGateway}); err != nil {
				t.Fatal(err)
			}
			d, ctx = stepProceed(t, eng, "k1") // takeover of the failed record
			count("first step of a resumed execution (read the steps)", 1, func() error {
				out, err := core.Step(ctx, "charge", charge)
				if err == nil && string(out) != "ch_1" {
					err = errors.New("resumed step returned " + string(out))
				}
				return err
			})
			count("a new step of the resumed execution", 1, func() error {
				_, err := core.Step(ctx, "notify", charge)
				return err
			})
			if runs != 2 {
				t.Errorf("step functions ran %d times, want 2 (charge once, notify once)", runs)
			}
			if err := eng.Commit(t.Context(), d, adapterkit.Response{Status: 201}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStepOutsideBusinessTx: in transactional mode a step is committed on
// its own: when the handler's transaction rolls back (5xx, panic), the
// business row vanishes but the step stays, and the retry resumes from it.
func TestStepOutsideBusinessTx(t *testing.T) {
	pool := pgstoretest.Pool(t)
	s := newStore(t, pool)
	table := ledger(t, s)
	eng := stepEngine(t, s)
	runs := 0
	charge := func(context.Context) ([]byte, error) { runs++; return []byte("ch_1"), nil }

	d, ctx := stepProceed(t, eng, "k1")
	if err := handle(ctx, table, "k1"); err != nil { // business write first: the tx is open
		t.Fatal(err)
	}
	if _, err := core.Step(ctx, "charge", charge); err != nil {
		t.Fatal(err)
	}
	if err := eng.Commit(t.Context(), d, adapterkit.Response{Status: http.StatusServiceUnavailable}); err != nil {
		t.Fatal(err)
	}
	if rows := ledgerRows(t, s, table, "k1"); len(rows) != 0 {
		t.Fatalf("after the 503 the ledger holds %v, want nothing (rolled back)", rows)
	}

	d, ctx = stepProceed(t, eng, "k1")
	out, err := core.Step(ctx, "charge", charge)
	if err != nil || string(out) != "ch_1" || runs != 1 {
		t.Fatalf("resumed step: %q, %v, %d runs; want the stored ch_1 and 1 run", out, err, runs)
	}
	if err := handle(ctx, table, "k1"); err != nil {
		t.Fatal(err)
	}
	if err := eng.Commit(t.Context(), d, adapterkit.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if rows := ledgerRows(t, s, table, "k1"); len(rows) != 1 {
		t.Fatalf("ledger holds %v, want one row", rows)
	}
}

// TestStepSweptWithRecord: the steps table holds nothing for a record once
// Sweep removed it.
func TestStepSweptWithRecord(t *testing.T) {
	pool := pgstoretest.Pool(t)
	s := newStore(t, pool, WithRetentionMargin(0))
	steps := func() int {
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+stepsTable(s.cfg)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	req := claimReq("k1", time.Minute)
	req.Retention = 100 * time.Millisecond
	_, f := mustClaim(t, s, req)
	for _, name := range []string{"reserve", "charge"} {
		if err := s.SaveStep(t.Context(), f, name, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Complete(t.Context(), f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if n := steps(); n != 2 {
		t.Fatalf("%d step rows before the sweep, want 2", n)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := s.Sweep(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	if n := steps(); n != 0 {
		t.Errorf("%d step rows after the record was swept, want 0", n)
	}
}

// TestStepOnAsyncSession: a session running with synchronous_commit = off
// (a store pool configured for speed) still stores steps, and leaves the
// session's setting as it was.
func TestStepOnAsyncSession(t *testing.T) {
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool := pgstoretest.NewPool(t, cfg)
	s := newStore(t, pool)
	_, f := mustClaim(t, s, claimReq("k1", time.Minute))
	if err := s.SaveStep(t.Context(), f, "charge", []byte("ch_1")); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadSteps(t.Context(), f)
	if err != nil || string(got["charge"]) != "ch_1" {
		t.Fatalf("LoadSteps: %q, %v", got, err)
	}
	var setting string
	if err := pool.QueryRow(t.Context(), "SHOW synchronous_commit").Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != "off" {
		t.Errorf("session synchronous_commit is %q after a step, want the session's own off", setting)
	}
}
