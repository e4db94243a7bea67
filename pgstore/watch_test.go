package pgstore

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// The waiter's engine polls so rarely (watchPoll, beyond its whole wait)
// that only a notification can wake it before its wait ends with a 409.
const (
	watchWait = 20 * time.Second
	watchPoll = time.Minute
)

// waitingPair returns an owner engine on one store and a waiting engine on
// a second store (its own pool) sharing the schema: two instances.
func waitingPair(t *testing.T, opts ...Option) (owner, waiter *core.Engine, a, b *Store) {
	t.Helper()
	a, b = twoStores(t, opts...)
	owner, err := core.New(a, core.WithLease(10*time.Second), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	waiter, err = core.New(b, core.WithLease(10*time.Second), core.WithWait(watchWait), core.WithWaitPoll(watchPoll), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	return owner, waiter, a, b
}

func watchReq(key string) core.Request {
	return core.Request{
		Method: http.MethodPost, Route: "/v1/payments", Scope: "user-1",
		Header: http.Header{"Idempotency-Key": {`"` + key + `"`}},
		Body:   bytes.NewReader([]byte(`{"amount":1000}`)),
	}
}

// ownerAndWaiter claims key on owner, starts a duplicate on waiting and
// returns once that duplicate waits (it has marked the record).
func ownerAndWaiter(t *testing.T, owner, waiting *core.Engine, s *Store, key string) (*core.Decision, <-chan *core.Decision) {
	t.Helper()
	d, err := owner.Decide(t.Context(), watchReq(key))
	if err != nil || d.Outcome != core.Proceed {
		t.Fatalf("owner: %v %v", d.Outcome, err)
	}
	got := decideAsync(t, waiting, key)
	waitMarked(t, s, key)
	return d, got
}

// decideAsync runs the waiter's Decide in a goroutine.
func decideAsync(t *testing.T, e *core.Engine, key string) <-chan *core.Decision {
	out := make(chan *core.Decision, 1)
	go func() {
		d, err := e.Decide(context.Background(), watchReq(key))
		if err != nil {
			t.Errorf("waiter decide: %v", err)
		}
		out <- d
	}()
	return out
}

// waitMarked waits until a waiter has marked (scope user-1, key).
func waitMarked(t *testing.T, s *Store, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var marked bool
		err := s.pool.QueryRow(t.Context(), `SELECT waiters FROM `+s.names.table+` WHERE scope = 'user-1' AND key = $1`, key).Scan(&marked)
		if err != nil && err != pgx.ErrNoRows {
			t.Fatalf("read waiters: %v", err)
		}
		if marked {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the waiter never marked the record")
}

// receive returns the waiter's decision. The waiter must have been woken by
// a notification: at its wait deadline the engine reads the record once
// more and would return the same answer, so the test also requires the
// answer well before that deadline (the notification takes milliseconds;
// the bound is half the wait, 10 s).
func receive(t *testing.T, ch <-chan *core.Decision, since time.Time) *core.Decision {
	t.Helper()
	select {
	case d := <-ch:
		if d == nil {
			t.Fatal("waiter returned no decision")
		}
		if took := time.Since(since); took >= watchWait/2 {
			t.Fatalf("waiter answered %v after the change: woken by its deadline, not by a notification", took)
		}
		return d
	case <-time.After(watchWait + 10*time.Second):
		t.Fatal("waiter never returned")
		return nil
	}
}

// A duplicate waiting on another instance replays as soon as the owner
// commits: its polling interval is longer than its whole wait, so without
// the notification it would end with a 409.
func TestWatchWakesWaiterOnComplete(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			owner, waiting, a, _ := waitingPair(t, m.opts...)
			d, got := ownerAndWaiter(t, owner, waiting, a, "k1")
			began := time.Now()
			if err := owner.Commit(d.Context(t.Context()), d, adapterkit.Response{Status: 201, Body: []byte(`{"id":"p1"}`)}); err != nil {
				t.Fatal(err)
			}
			w := receive(t, got, began)
			if w.Outcome != core.Replay || w.Response.Status != 201 || string(w.Response.Body) != `{"id":"p1"}` {
				t.Fatalf("waiter got %v %d %q, want a replay of the 201", w.Outcome, w.Response.Status, w.Response.Body)
			}
			t.Logf("woken %v after the commit began", time.Since(began))
		})
	}
}

// The owner fails (its handler panicked or returned a 5xx): the waiter is
// woken and takes the key over at once.
func TestWatchWakesWaiterOnFail(t *testing.T) {
	owner, waiting, a, _ := waitingPair(t)
	d, got := ownerAndWaiter(t, owner, waiting, a, "k2")
	began := time.Now()
	if err := owner.Abort(t.Context(), d, context.Canceled); err != nil {
		t.Fatal(err)
	}
	w := receive(t, got, began)
	if w.Outcome != core.Proceed {
		t.Fatalf("waiter got %v, want to take the failed key over", w.Outcome)
	}
	if err := waiting.Commit(w.Context(t.Context()), w, adapterkit.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
}

// Transactional mode: the notification follows the commit of the handler's
// transaction, and the waiter replays what it committed.
func TestWatchWakesWaiterInTx(t *testing.T) {
	owner, waiting, a, _ := waitingPair(t)
	table := ledger(t, a)
	d, got := ownerAndWaiter(t, owner, waiting, a, "k3")
	hctx := d.Context(t.Context())
	if err := handle(hctx, table, "k3"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := owner.Commit(hctx, d, adapterkit.Response{Status: 201, Body: []byte(`{"id":"p3"}`)}); err != nil {
		t.Fatal(err)
	}
	if w := receive(t, got, began); w.Outcome != core.Replay || string(w.Response.Body) != `{"id":"p3"}` {
		t.Fatalf("waiter got %v %q, want the replay", w.Outcome, w.Response.Body)
	}
	var rows int
	if err := a.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("ledger rows %d (%v), want 1", rows, err)
	}
}

// The listener's connection dies while a duplicate waits: the waiter is
// woken, finds the key still in flight, starts a new listener, and is woken
// again by the commit.
func TestWatchListenerRestarts(t *testing.T) {
	owner, waiting, a, b := waitingPair(t)
	d, got := ownerAndWaiter(t, owner, waiting, a, "k4")
	first := listenerPID(t, b)
	var ok bool
	if err := a.pool.QueryRow(t.Context(), `SELECT pg_terminate_backend($1)`, first).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate listener %d: %v %v", first, ok, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pid := listenerPID(t, b); pid == 0 || pid == first; pid = listenerPID(t, b) {
		if time.Now().After(deadline) {
			t.Fatal("no new listener after the first was terminated")
		}
		time.Sleep(5 * time.Millisecond)
	}
	began := time.Now()
	if err := owner.Commit(d.Context(t.Context()), d, adapterkit.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if w := receive(t, got, began); w.Outcome != core.Replay {
		t.Fatalf("waiter got %v, want a replay", w.Outcome)
	}
	// Nobody waits any more: the listener goes away.
	for listenerPID(t, b) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the listener outlived its last waiter")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// listenerPID is the backend of s's listener, 0 when none is LISTENing.
func listenerPID(t *testing.T, s *Store) uint32 {
	t.Helper()
	s.watch.mu.Lock()
	l := s.watch.l
	s.watch.mu.Unlock()
	if l == nil {
		return 0
	}
	return l.conn.PgConn().PID()
}

// A first execution nobody waits for sends no NOTIFY (and so never takes
// PostgreSQL's notify lock); one somebody waited for sends exactly one.
func TestWatchNotifiesOnlyWhenWaited(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgstoretest.Config(t)
			cfg.MaxConns = 4
			pool := pgstoretest.NewPool(t, cfg)
			s := newStore(t, pool, m.opts...)
			conn, err := pgx.ConnectConfig(t.Context(), pool.Config().ConnConfig.Copy())
			if err != nil {
				t.Fatal(err)
			}
			defer closeConn(conn)
			if _, err := conn.Exec(t.Context(), "LISTEN "+pgx.Identifier{s.watch.channel}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			eng, err := core.New(s, core.WithSharedKeySpace())
			if err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"n1", "n2", "n3"} {
				d, err := eng.Decide(t.Context(), watchReq(key))
				if err != nil || d.Outcome != core.Proceed {
					t.Fatalf("decide: %v %v", d.Outcome, err)
				}
				if err := eng.Commit(d.Context(t.Context()), d, adapterkit.Response{Status: 201}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			n, err := conn.WaitForNotification(ctx)
			cancel()
			if err == nil {
				t.Fatalf("unwaited completes sent a NOTIFY %q", n.Payload)
			}

			d, err := eng.Decide(t.Context(), watchReq("w1"))
			if err != nil || d.Outcome != core.Proceed {
				t.Fatalf("decide: %v %v", d.Outcome, err)
			}
			if _, err := s.pool.Exec(t.Context(), s.sql.mark, "user-1", "w1"); err != nil {
				t.Fatal(err)
			}
			if err := eng.Commit(d.Context(t.Context()), d, adapterkit.Response{Status: 201}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
			n, err = conn.WaitForNotification(ctx)
			cancel()
			if err != nil {
				t.Fatalf("a waited-for complete sent no NOTIFY: %v", err)
			}
			if n.Payload != notifyPayload("user-1", "w1") {
				t.Fatalf("payload %q, want the hash of (user-1, w1)", n.Payload)
			}
		})
	}
}
