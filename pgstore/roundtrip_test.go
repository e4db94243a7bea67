package pgstore

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// roundTrips counts round trips on the wire: on each connection, a write
// that follows a read (or is the first) starts one. It sees what pgx
// really sends, statement preparations included.
type roundTrips struct {
	mu sync.Mutex
	n  int
}

func (r *roundTrips) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &rtConn{Conn: c, rt: r}, nil
}

func (r *roundTrips) take() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.n
	r.n = 0
	return n
}

type rtConn struct {
	net.Conn
	rt      *roundTrips
	writing bool
}

func (c *rtConn) Write(b []byte) (int, error) {
	c.rt.mu.Lock()
	if !c.writing {
		c.writing = true
		c.rt.n++
	}
	c.rt.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *rtConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.rt.mu.Lock()
	c.writing = false
	c.rt.mu.Unlock()
	return n, err
}

// TestTxRoundTrips pins the round trips of a first execution in
// transactional mode, counted on the wire: claim 1; a handler with one
// statement 1 (BEGIN travels with it); complete + COMMIT 1. A failed
// execution: ROLLBACK + fail 1. A handler that asked for the transaction
// but ran nothing: complete 1 (no BEGIN, no COMMIT).
func TestTxRoundTrips(t *testing.T) {
	for _, m := range modes {
		for _, idle := range []time.Duration{0, time.Minute} {
			name := m.name
			if idle > 0 {
				name += "/idle_timeout"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				rt := &roundTrips{}
				cfg := pgstoretest.Config(t)
				cfg.MaxConns = 1
				cfg.ConnConfig.DialFunc = rt.dial
				pool := pgstoretest.NewPool(t, cfg)
				s := newStore(t, pool, append([]Option{WithTransactional(), WithTxIdleTimeout(idle)}, m.opts...)...)
				table := ledger(t, s)
				ctx := t.Context()

				// Everything runs twice; the first pass prepares every
				// statement (and checks the schema), the second is counted.
				pass := 0
				count := func(what string, want int, fn func() error) {
					t.Helper()
					rt.take()
					if err := fn(); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					if got := rt.take(); pass == 1 && got != want {
						t.Errorf("%s: %d round trips, want %d", what, got, want)
					}
				}
				var (
					f    storekit.Fence
					hctx context.Context
				)
				claim := func(key string) func() error {
					return func() error {
						req := claimReq(key, time.Minute)
						res, err := s.Claim(ctx, req)
						if err == nil && !res.Claimed {
							err = errors.New("not claimed")
						}
						f = storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
						hctx = storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
						return err
					}
				}
				handler := func() error { return handle(hctx, table, f.Key) }
				complete := func() error { return s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte("ok")}) }
				fail := func() error { return s.Fail(hctx, f) }

				for pass = range 2 {
					k := func(key string) string { return key + "-" + string(rune('a'+pass)) }
					count("claim", 1, claim(k("k1")))
					count("Tx", 0, func() error { _, err := Tx(hctx); return err })
					count("handler: one statement (BEGIN pipelined)", 1, handler)
					count("handler: a second statement", 1, func() error {
						tx, err := Tx(hctx)
						if err != nil {
							return err
						}
						var n int
						return tx.QueryRow(hctx, "SELECT count(*) FROM "+table).Scan(&n)
					})
					count("complete + COMMIT", 1, complete)
					if got := ledgerRows(t, s, table, k("k1")); len(got) != 1 {
						t.Errorf("ledger rows after commit: %v, want one", got)
					}

					count("claim 2", 1, claim(k("k2")))
					count("handler 2", 1, handler)
					count("ROLLBACK + fail", 1, fail)
					if got := ledgerRows(t, s, table, k("k2")); len(got) != 0 {
						t.Errorf("ledger rows after fail: %v, want none", got)
					}

					count("claim 3", 1, claim(k("k3")))
					count("Tx, no statement", 0, func() error { _, err := Tx(hctx); return err })
					count("complete without a transaction", 1, complete)

					// The first statement as a Query, read to the end.
					count("claim 4", 1, claim(k("k4")))
					count("handler: first statement a Query", 1, func() error {
						tx, err := Tx(hctx)
						if err != nil {
							return err
						}
						rows, err := tx.Query(hctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2) RETURNING id", f.Key, f.Token)
						if err != nil {
							return err
						}
						ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
						if err == nil && len(ids) != 1 {
							err = errors.New("no id returned")
						}
						return err
					})
					count("complete + COMMIT 4", 1, complete)
					if got := ledgerRows(t, s, table, k("k4")); len(got) != 1 {
						t.Errorf("ledger rows after commit: %v, want one", got)
					}

					// Deferred writes travel with the complete: a first
					// execution is two round trips.
					count("claim 5", 1, claim(k("k5")))
					count("Defer", 0, func() error { return deferRow(hctx, table, f.Key) })
					count("Defer, a second statement", 0, func() error {
						return Defer(hctx, "UPDATE "+table+" SET token = token WHERE key = $1", f.Key)
					})
					count("deferred statements + complete", 1, complete)
					if got := ledgerRows(t, s, table, k("k5")); len(got) != 1 {
						t.Errorf("ledger rows after a deferred commit: %v, want one", got)
					}
					count("claim 6", 1, claim(k("k6")))
					count("handler 6", 1, handler)
					count("Defer after Tx", 0, func() error { return deferRow(hctx, table, f.Key) })
					count("deferred statements + complete + COMMIT", 1, complete)
					if got := ledgerRows(t, s, table, k("k6")); len(got) != 2 {
						t.Errorf("ledger rows after Tx and Defer: %v, want two", got)
					}
				}
				if st := pool.Stat(); st.AcquiredConns() != 0 {
					t.Errorf("%d connections still acquired", st.AcquiredConns())
				}
			})
		}
	}
}

// TestTxPipelinedCommitStaleOwner: the complete and COMMIT travel together,
// so a stale owner's COMMIT is already on the wire when its fence fails;
// its business writes must still roll back, and the new owner's survive.
// Also with the first statement as a batch and with a savepoint.
func TestTxPipelinedCommitStaleOwner(t *testing.T) {
	for _, m := range modes {
		for _, em := range []struct {
			name string
			mode pgx.QueryExecMode
		}{{"", 0}, {"/exec", pgx.QueryExecModeExec}, {"/simple_protocol", pgx.QueryExecModeSimpleProtocol}} {
			t.Run(m.name+em.name, func(t *testing.T) {
				t.Parallel()
				cfg := pgstoretest.Config(t)
				if em.mode != 0 {
					cfg.ConnConfig.DefaultQueryExecMode = em.mode
				}
				s := newStore(t, pgstoretest.NewPool(t, cfg), append([]Option{WithTransactional()}, m.opts...)...)
				table := ledger(t, s)
				req := claimReq("stale", 50*time.Millisecond)
				ctx, f := mustClaim(t, s, req)
				tx, err := Tx(ctx)
				if err != nil {
					t.Fatal(err)
				}
				b := &pgx.Batch{}
				b.Queue("INSERT INTO "+table+" (key, token) VALUES ($1, $2)", req.Key, f.Token)
				b.Queue("INSERT INTO "+table+" (key, token) VALUES ($1, $2)", req.Key, f.Token)
				if err := tx.SendBatch(ctx, b).Close(); err != nil {
					t.Fatalf("stale owner's batch: %v", err)
				}
				sp, err := tx.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := sp.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", req.Key, f.Token); err != nil {
					t.Fatal(err)
				}
				if err := sp.Commit(ctx); err != nil { // releases the savepoint
					t.Fatal(err)
				}

				time.Sleep(100 * time.Millisecond) // the lease lapses
				res, err := s.Claim(t.Context(), req)
				if err != nil || !res.Claimed {
					t.Fatalf("takeover: %+v, %v", res, err)
				}
				nf := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
				nctx := storetest.ContextWithLease(t.Context(), storetest.NewLease(s, nf))
				if err := handle(nctx, table, req.Key); err != nil {
					t.Fatal(err)
				}
				if err := s.Complete(nctx, nf, storekit.StoredResponse{Status: 201, Body: []byte("new")}); err != nil {
					t.Fatalf("new owner's complete: %v", err)
				}

				err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("stale")})
				if !errors.Is(err, core.ErrLeaseLost) {
					t.Fatalf("stale owner's complete = %v, want ErrLeaseLost", err)
				}
				if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != nf.Token {
					t.Fatalf("ledger = %v, want only the new owner's row (token %d)", got, nf.Token)
				}
				rec, err := s.Get(t.Context(), req.Scope, req.Key)
				if err != nil || rec.Response == nil || string(rec.Response.Body) != "new" {
					t.Fatalf("record = %+v, %v; want the new owner's response", rec, err)
				}
				if _, err := tx.Exec(ctx, "SELECT 1"); !errors.Is(err, ErrLeaseFinished) || !errors.Is(err, pgx.ErrTxClosed) {
					t.Fatalf("using the transaction after Complete = %v, want ErrLeaseFinished and pgx.ErrTxClosed", err)
				}
				if st := s.pool.Stat(); st.AcquiredConns() != 0 {
					t.Fatalf("%d connections still acquired", st.AcquiredConns())
				}
			})
		}
	}
}

// TestTxFirstStatementFails: the handler's first statement fails (its BEGIN
// went with it): the transaction is aborted like any pgx transaction whose
// statement failed, Complete rolls it back and the record is failed, so a
// retry can run at once.
func TestTxFirstStatementFails(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t), WithTransactional())
	table := ledger(t, s)
	req := claimReq("bad", time.Minute)
	ctx, f := mustClaim(t, s, req)
	tx, err := Tx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, NULL)", req.Key); err == nil {
		t.Fatal("inserting NULL into a NOT NULL column succeeded")
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", req.Key, f.Token); err == nil {
		t.Fatal("a statement after a failed one succeeded: the transaction was not aborted")
	}
	err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201})
	if err == nil || errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("complete after a failed statement = %v, want a failure other than ErrLeaseLost", err)
	}
	if got := ledgerRows(t, s, table, req.Key); len(got) != 0 {
		t.Fatalf("ledger = %v, want empty", got)
	}
	rec, err := s.Get(t.Context(), req.Scope, req.Key)
	if err != nil || rec.Status != storekit.StatusFailed {
		t.Fatalf("record = %+v, %v; want failed", rec, err)
	}
	if st := s.pool.Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired", st.AcquiredConns())
	}
}

// TestTxExplicitBegin: the calls that cannot carry BEGIN in a pipeline
// (CopyFrom, Begin, LargeObjects, Conn) begin the transaction first when
// they come first; their writes commit with the record, or vanish with it.
func TestTxExplicitBegin(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t), WithTransactional())
	table := ledger(t, s)
	for _, c := range []struct {
		name  string
		first func(ctx context.Context, tx pgx.Tx, key string, token int64) error
	}{
		{"CopyFrom", func(ctx context.Context, tx pgx.Tx, key string, token int64) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{s.cfg.schema, "ledger"}, []string{"key", "token"},
				pgx.CopyFromRows([][]any{{key, token}}))
			return err
		}},
		{"Begin", func(ctx context.Context, tx pgx.Tx, key string, token int64) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, token); err != nil {
				return err
			}
			return sp.Commit(ctx)
		}},
		{"LargeObjects", func(ctx context.Context, tx pgx.Tx, key string, token int64) error {
			lo := tx.LargeObjects()
			oid, err := lo.Create(ctx, 0)
			if err != nil {
				return err
			}
			t.Cleanup(func() { // large objects outlive the test's schema
				_, _ = s.pool.Exec(context.Background(), "SELECT lo_unlink($1) FROM pg_largeobject_metadata WHERE oid = $1", oid)
			})
			_, err = tx.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, token)
			return err
		}},
		{"Conn", func(ctx context.Context, tx pgx.Tx, key string, token int64) error {
			if tx.Conn() == nil {
				return errors.New("Conn() = nil")
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, token)
			return err
		}},
		// The write goes through the connection itself, as a library
		// taking a *pgx.Conn does: it must be in the transaction too.
		{"Conn.Exec", func(ctx context.Context, tx pgx.Tx, key string, token int64) error {
			c := tx.Conn()
			if c == nil {
				return errors.New("Conn() = nil")
			}
			_, err := c.Exec(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, token)
			return err
		}},
	} {
		for _, commit := range []bool{true, false} {
			key := c.name + map[bool]string{true: "-commit", false: "-fail"}[commit]
			ctx, f := mustClaim(t, s, claimReq(key, time.Minute))
			tx, err := Tx(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.first(ctx, tx, key, f.Token); err != nil {
				t.Fatalf("%s first: %v", c.name, err)
			}
			want := 0
			if commit {
				want = 1
				err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201})
			} else {
				err = s.Fail(ctx, f)
			}
			if err != nil {
				t.Fatalf("%s: end: %v", key, err)
			}
			if got := ledgerRows(t, s, table, key); len(got) != want {
				t.Errorf("%s: ledger rows %v, want %d", key, got, want)
			}
		}
	}
	if st := s.pool.Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired", st.AcquiredConns())
	}
}
