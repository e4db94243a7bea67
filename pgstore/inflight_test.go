package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// Completes caught in flight: the complete pipeline has reached the server
// and waits there on a lock another session holds (the record's row, or an
// advisory lock a deferred statement takes), while the client gives up (its
// context is cancelled: pgx closes the connection and sends a cancel
// request, which may or may not reach the statement before it commits) or
// the lease lapses and another owner takes the key over.

// appPool is a pool whose backends carry a unique application_name, to
// watch them in pg_stat_activity, dialing through a faultDialer.
func appPool(t *testing.T) (*pgxpool.Pool, string, *faultDialer) {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	app := "idem_inflight_" + hex.EncodeToString(b[:])
	d := &faultDialer{}
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.DialFunc = d.dial
	return pgstoretest.NewPool(t, cfg), app, d
}

// waitBackends waits until n backends of app are in the state the
// condition on pg_stat_activity describes.
func waitBackends(t *testing.T, admin *pgxpool.Pool, app string, n int, cond string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var got int
		if err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND `+cond, app).Scan(&got); err != nil {
			t.Fatalf("pg_stat_activity: %v", err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends of the pool where %s, want %d", got, cond, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const (
	waitingOnLock = `wait_event_type = 'Lock'`
	notIdle       = `state <> 'idle'`
)

// holdLock begins a transaction on admin that runs sql (taking a lock) and
// returns its end.
func holdLock(t *testing.T, admin *pgxpool.Pool, sql string, args ...any) (release func()) {
	t.Helper()
	tx, err := admin.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), sql, args...); err != nil {
		_ = tx.Rollback(t.Context())
		t.Fatalf("%s: %v", sql, err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			if err := tx.Commit(context.Background()); err != nil {
				t.Errorf("release lock: %v", err)
			}
		}
	}
	t.Cleanup(release)
	return release
}

// TestCompleteCancelledInFlight: the complete pipeline waits on a lock; the
// commit's context is cancelled. pgx closes the connection and sends a
// cancel request; the test runs with it delivered and with it lost (the
// statement then runs on once the lock is released). The complete pipeline
// waits either on the record's row (the fenced fail that releases the key
// then queues behind it), or in a deferred statement, before the fenced
// complete (the fail then commits first). Whatever the order, the ledger
// row committed exactly when the response was recorded; a committed
// response is never reported as not committed, nor released; writes that
// did not commit leave the key claimable and the retry commits them once.
func TestCompleteCancelledInFlight(t *testing.T) {
	cases := []struct {
		name, writer string
		lockRecord   bool // else a deferred statement waits on an advisory lock
	}{
		{"defer/record-locked", "defer", true},
		{"tx/record-locked", "tx", true},
		{"tx+defer/record-locked", "tx+defer", true},
		{"defer/deferred-waits", "defer", false},
		{"tx+defer/deferred-waits", "tx+defer", false},
	}
	for _, m := range deferModes() {
		for _, c := range cases {
			for _, lost := range []bool{false, true} {
				name := m.name + "/" + c.name + map[bool]string{false: "/cancelled", true: "/cancel-lost"}[lost]
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					pool, app, d := appPool(t)
					d.noCancel = lost
					admin := pgstoretest.Pool(t)
					s := newStore(t, pool, m.opts...)
					table := ledger(t, s)
					req := claimReq("k", time.Minute)
					lockID := time.Now().UnixNano()
					write := func(ctx context.Context, wait bool) error {
						if c.writer != "defer" {
							if err := handle(ctx, table, req.Key); err != nil {
								return err
							}
						}
						if c.writer == "tx" {
							return nil
						}
						if wait {
							if err := Defer(ctx, "SELECT pg_advisory_xact_lock_shared($1)", lockID); err != nil {
								return err
							}
						}
						if c.writer == "tx+defer" {
							return Defer(ctx, "UPDATE "+table+" SET token = token + 0 WHERE key = $1", req.Key)
						}
						return deferRow(ctx, table, req.Key)
					}
					ctx, f := mustClaim(t, s, req)
					if err := write(ctx, !c.lockRecord); err != nil {
						t.Fatal(err)
					}
					var release func()
					if c.lockRecord {
						release = holdLock(t, admin, `SELECT 1 FROM `+s.names.table+` WHERE scope = $1 AND key = $2 FOR UPDATE`, req.Scope, req.Key)
					} else {
						release = holdLock(t, admin, `SELECT pg_advisory_xact_lock($1)`, lockID)
					}
					cctx, cancel := context.WithCancel(ctx)
					done := make(chan error, 1)
					go func() {
						done <- s.Complete(cctx, f, storekit.StoredResponse{Status: 201, Body: []byte("paid")})
					}()
					waitBackends(t, admin, app, 1, waitingOnLock+` AND query NOT LIKE '%''failed''%'`)
					cancel()
					var err error
					if c.lockRecord {
						// The fenced fail that releases the key waits
						// too, behind the pipeline if it still runs.
						waitBackends(t, admin, app, 1, waitingOnLock+` AND query LIKE '%''failed''%'`)
						release()
						err = <-done
					} else {
						err = <-done
						release()
					}
					waitBackends(t, admin, app, 0, notIdle) // the abandoned pipeline has ended
					if err == nil {
						t.Fatal("Complete succeeded although its context was cancelled in flight")
					}
					rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
					if gerr != nil {
						t.Fatalf("get: %v", gerr)
					}
					rows := ledgerRows(t, s, table, req.Key)
					t.Logf("Complete = %v; record %s, ledger %v", err, rec.Status, rows)
					if lost && c.lockRecord && len(rows) != 1 {
						t.Errorf("the pipeline was not cancelled and queued first on the record: it must have committed; ledger %v", rows)
					}
					switch {
					case len(rows) == 1 && rec.Status == storekit.StatusCompleted:
						if errors.Is(err, storekit.ErrNotCommitted) {
							t.Errorf("Complete = %v: reports as not committed writes that committed", err)
						}
						if res, err := s.Claim(t.Context(), req); err != nil || res.Claimed {
							t.Errorf("retry: claimed %v (%v); want the recorded response", res.Claimed, err)
						}
					case len(rows) == 0 && rec.Status == storekit.StatusFailed:
						ctx2, f2 := mustClaim(t, s, req)
						if err := write(ctx2, false); err != nil {
							t.Fatal(err)
						}
						if err := s.Complete(ctx2, f2, storekit.StoredResponse{Status: 201, Body: []byte("paid")}); err != nil {
							t.Fatalf("retry's Complete: %v", err)
						}
						if rows := ledgerRows(t, s, table, req.Key); len(rows) != 1 || rows[0] != f2.Token {
							t.Errorf("after the retry: ledger %v, want [%d]", rows, f2.Token)
						}
					default:
						t.Fatalf("ledger %v with record %s: the writes and the recorded outcome disagree", rows, rec.Status)
					}
				})
			}
		}
	}
}

// TestCompleteInFlightLeaseTakenOver: the lease lapses while the owner's
// complete pipeline waits on a lock, and another owner claims the key.
//
//   - The pipeline waits in a deferred statement (a lock): the takeover
//     wins the record; the first owner's fenced complete then matches
//     nothing and its writes roll back (ErrLeaseLost); the new owner's
//     commit is the only one.
//   - The pipeline waits on the record's row: the takeover's claim queues
//     behind it; the first owner commits (its token is still the
//     record's), and the claim then finds the key completed and replays it.
func TestCompleteInFlightLeaseTakenOver(t *testing.T) {
	for _, m := range deferModes() {
		t.Run(m.name+"/deferred-waits", func(t *testing.T) {
			t.Parallel()
			pool, app, _ := appPool(t)
			admin := pgstoretest.Pool(t)
			s := newStore(t, pool, m.opts...)
			table := ledger(t, s)
			req := claimReq("k", 300*time.Millisecond)
			lockID := time.Now().UnixNano()
			ctx, f := mustClaim(t, s, req)
			if err := Defer(ctx, "SELECT pg_advisory_xact_lock_shared($1)", lockID); err != nil {
				t.Fatal(err)
			}
			if err := deferRow(ctx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			release := holdLock(t, admin, `SELECT pg_advisory_xact_lock($1)`, lockID)
			first := make(chan error, 1)
			go func() { first <- s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("first")}) }()
			waitBackends(t, admin, app, 1, waitingOnLock)
			waitLapsed(t, s, req, f)
			ctx2, f2 := mustClaim(t, s, req) // the record is not locked: the takeover wins it
			if err := Defer(ctx2, "SELECT pg_advisory_xact_lock_shared($1)", lockID); err != nil {
				t.Fatal(err)
			}
			if err := deferRow(ctx2, table, req.Key); err != nil {
				t.Fatal(err)
			}
			second := make(chan error, 1)
			go func() { second <- s.Complete(ctx2, f2, storekit.StoredResponse{Status: 201, Body: []byte("second")}) }()
			waitBackends(t, admin, app, 2, waitingOnLock)
			release()
			if err := <-first; !errors.Is(err, core.ErrLeaseLost) {
				t.Errorf("first owner's Complete = %v, want ErrLeaseLost", err)
			}
			if err := <-second; err != nil {
				t.Errorf("new owner's Complete = %v", err)
			}
			if rows := ledgerRows(t, s, table, req.Key); len(rows) != 1 || rows[0] != f2.Token {
				t.Errorf("ledger %v, want only the new owner's row [%d]", rows, f2.Token)
			}
			if rec, err := s.Get(t.Context(), req.Scope, req.Key); err != nil || rec.Response == nil || string(rec.Response.Body) != "second" {
				t.Errorf("record %+v (%v), want the new owner's response", rec, err)
			}
		})
		for _, writer := range []string{"tx", "defer"} {
			t.Run(m.name+"/record-locked/"+writer, func(t *testing.T) {
				t.Parallel()
				pool, app, _ := appPool(t)
				admin := pgstoretest.Pool(t)
				s := newStore(t, pool, m.opts...)
				table := ledger(t, s)
				req := claimReq("k", 300*time.Millisecond)
				ctx, f := mustClaim(t, s, req)
				write := handle
				if writer == "defer" {
					write = deferRow
				}
				if err := write(ctx, table, req.Key); err != nil {
					t.Fatal(err)
				}
				release := holdLock(t, admin, `SELECT 1 FROM `+s.names.table+` WHERE scope = $1 AND key = $2 FOR UPDATE`, req.Scope, req.Key)
				first := make(chan error, 1)
				go func() { first <- s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("first")}) }()
				waitBackends(t, admin, app, 1, waitingOnLock)
				waitLapsed(t, s, req, f)
				type claimed struct {
					res storekit.ClaimResult
					err error
				}
				retry := make(chan claimed, 1)
				go func() {
					res, err := s.Claim(t.Context(), req)
					retry <- claimed{res, err}
				}()
				waitBackends(t, admin, app, 2, waitingOnLock)
				release()
				if err := <-first; err != nil {
					t.Errorf("first owner's Complete = %v: it was queued on the record before the takeover", err)
				}
				r := <-retry
				if r.err != nil || r.res.Claimed || r.res.Record.Response == nil || string(r.res.Record.Response.Body) != "first" {
					t.Errorf("retry: claimed %v (%v) %+v; want the first owner's response replayed", r.res.Claimed, r.err, r.res.Record)
				}
				if r.res.Claimed {
					// Clean up the transaction state of a wrong takeover.
					l := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: r.res.Record.Token}
					_ = s.Fail(t.Context(), l)
				}
				if rows := ledgerRows(t, s, table, req.Key); len(rows) != 1 || rows[0] != f.Token {
					t.Errorf("ledger %v, want the first owner's row [%d]", rows, f.Token)
				}
			})
		}
	}
}

// TestCompleteUnderSessionTimeouts: the pool's sessions carry server-side
// timeouts (RuntimeParams, as deployments set them) that end the handler's
// transaction or the complete pipeline: idle_in_transaction_session_timeout
// kills the session while the handler idles in its Tx (FATAL),
// statement_timeout cancels a slow deferred statement, lock_timeout gives
// up the fenced complete waiting on the record's row (the fenced fail
// that would release the key gives up too: the key stays in flight until
// its lease lapses). Nothing committed: the response must not be recorded,
// and the retry commits the writes once.
func TestCompleteUnderSessionTimeouts(t *testing.T) {
	cases := []struct {
		name, param, value string
		writer             string
		// during: what happens between the handler's writes and Complete.
		during func(t *testing.T, admin *pgxpool.Pool, app string, s *Store, req storekit.ClaimRequest) (release func())
	}{
		{"idle_in_transaction/tx", "idle_in_transaction_session_timeout", "100ms", "tx",
			func(t *testing.T, admin *pgxpool.Pool, app string, _ *Store, _ storekit.ClaimRequest) func() {
				waitBackends(t, admin, app, 0, `state = 'idle in transaction'`) // the server ended it
				return func() {}
			}},
		{"idle_in_transaction/tx+defer", "idle_in_transaction_session_timeout", "100ms", "tx+defer",
			func(t *testing.T, admin *pgxpool.Pool, app string, _ *Store, _ storekit.ClaimRequest) func() {
				waitBackends(t, admin, app, 0, `state = 'idle in transaction'`)
				return func() {}
			}},
		// The timeout applies to every statement of the pool, the claim
		// included: 1s (not less) so that a loaded CI host does not time
		// the claim out; the deferred statement sleeps past it.
		{"statement_timeout/defer", "statement_timeout", "1s", "defer-slow", nil},
		{"statement_timeout/tx+defer", "statement_timeout", "1s", "tx+defer-slow", nil},
		{"lock_timeout/tx", "lock_timeout", "100ms", "tx",
			func(t *testing.T, admin *pgxpool.Pool, _ string, s *Store, req storekit.ClaimRequest) func() {
				return holdLock(t, admin, `SELECT 1 FROM `+s.names.table+` WHERE scope = $1 AND key = $2 FOR UPDATE`, req.Scope, req.Key)
			}},
		{"lock_timeout/defer", "lock_timeout", "100ms", "defer",
			func(t *testing.T, admin *pgxpool.Pool, _ string, s *Store, req storekit.ClaimRequest) func() {
				return holdLock(t, admin, `SELECT 1 FROM `+s.names.table+` WHERE scope = $1 AND key = $2 FOR UPDATE`, req.Scope, req.Key)
			}},
	}
	for _, m := range deferModes() {
		for _, c := range cases {
			t.Run(m.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				pool, app := sessionPool(t, c.param, c.value)
				admin := pgstoretest.Pool(t)
				// Set up without the timeouts (Migrate waits on a lock
				// other tests' migrations hold).
				as := newStore(t, admin, m.opts...)
				table := ledger(t, as)
				s, err := New(pool, append([]Option{WithSchema(as.cfg.schema)}, m.opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				req := claimReq("k", time.Second)
				write := func(ctx context.Context, slow bool) error {
					if c.writer == "tx" || c.writer == "tx+defer" || c.writer == "tx+defer-slow" {
						if err := handle(ctx, table, req.Key); err != nil {
							return err
						}
					}
					if slow && (c.writer == "defer-slow" || c.writer == "tx+defer-slow") {
						if err := Defer(ctx, "SELECT pg_sleep(3)"); err != nil {
							return err
						}
					}
					switch c.writer {
					case "defer", "defer-slow":
						return deferRow(ctx, table, req.Key)
					case "tx+defer", "tx+defer-slow":
						return Defer(ctx, "UPDATE "+table+" SET token = token + 0 WHERE key = $1", req.Key)
					}
					return nil
				}
				ctx, f := mustClaim(t, s, req)
				if err := write(ctx, true); err != nil {
					t.Fatal(err)
				}
				release := func() {}
				if c.during != nil {
					release = c.during(t, admin, app, s, req)
				}
				err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("paid")})
				release()
				rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
				if gerr != nil {
					t.Fatalf("get: %v", gerr)
				}
				rows := ledgerRows(t, s, table, req.Key)
				t.Logf("Complete = %v; record %s, ledger %v", err, rec.Status, rows)
				if err == nil || len(rows) != 0 || rec.Status == storekit.StatusCompleted {
					t.Fatalf("Complete = %v, ledger %v, record %s; want an error, no row, the response not recorded", err, rows, rec.Status)
				}
				if rec.Status == storekit.StatusProcessing {
					waitLapsed(t, s, req, f)
				}
				if errors.Is(err, core.ErrLeaseLost) {
					t.Errorf("Complete = %v: the lease was not lost", err)
				}
				waitReleased(t, pool)
				ctx2, f2 := mustClaim(t, s, req)
				if err := write(ctx2, false); err != nil {
					t.Fatal(err)
				}
				if err := s.Complete(ctx2, f2, storekit.StoredResponse{Status: 201, Body: []byte("paid")}); err != nil {
					t.Fatalf("retry's Complete: %v", err)
				}
				if rows := ledgerRows(t, s, table, req.Key); len(rows) != 1 || rows[0] != f2.Token {
					t.Errorf("after the retry: ledger %v, want [%d]", rows, f2.Token)
				}
			})
		}
	}
}

// sessionPool is appPool with one session parameter set on every
// connection.
func sessionPool(t *testing.T, param, value string) (*pgxpool.Pool, string) {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	app := "idem_session_" + hex.EncodeToString(b[:])
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.RuntimeParams[param] = value
	return pgstoretest.NewPool(t, cfg), app
}
