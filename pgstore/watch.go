package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
)

// Waking waiters (storekit.Watcher) with LISTEN/NOTIFY, paid for only by those
// who wait:
//
//   - A waiter (a duplicate in wait mode, core.WithWait) starts the store's
//     listener if it is not running — one dedicated connection per Store,
//     outside the pool, LISTENing on the store's channel — registers itself
//     under a hash of (scope, key), then marks the in-flight record
//     (UPDATE ... SET waiters = true WHERE ... status = 'processing').
//   - The owner's complete and fail statements return the flag. Only when
//     it is set does the store send pg_notify(channel, hash), in its own
//     transaction after the record's has committed: a NOTIFY inside the
//     completing transaction would hold PostgreSQL's notify lock across
//     the commit's WAL flush and serialise all notifying commits
//     (BENCHMARKS.md §2); a separate read-only transaction has no flush.
//   - The listener wakes the waiters registered under the payload. It
//     stops and closes its connection listenLinger after the last waiter
//     leaves: long enough that a waiter re-arming after a wake-up, or the
//     next duplicate of a busy service, finds it running (starting one
//     costs a connection and a LISTEN: several round trips); short enough that
//     an idle Store holds no connection and no goroutine for long.
//
// Nothing is lost by racing: the listener is LISTENing before the mark
// commits, so a complete that sees the mark notifies someone listening; a
// complete that commits before the mark makes the mark match nothing, and
// Watch then reports a change at once (the engine reads the record again).
// What is not covered — a NOTIFY that fails, a listener connection that
// dies (every waiter is woken), a dead owner whose lease lapses (nobody
// notifies) — falls back to the engine's polling, which keeps running
// alongside the watch (core.WithWaitPoll).

// notifyTimeout bounds the NOTIFY sent after a complete or fail: it is a
// courtesy to waiters, who poll anyway, and must not hold up Commit.
const notifyTimeout = 2 * time.Second

// listenTimeout bounds connecting the listener and the LISTEN.
const listenTimeout = 5 * time.Second

// listenLinger is how long the listener outlives its last waiter.
const listenLinger = 250 * time.Millisecond

// watchHub is a Store's listener and its waiters.
type watchHub struct {
	s       *Store
	channel string // NOTIFY channel, unique per schema.table

	startMu sync.Mutex // serialises starting the listener

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{} // by notifyPayload
	n       int                             // waiters registered
	l       *listener                       // nil: not running
	idle    *time.Timer                     // stops l after listenLinger; nil while waited on
	closed  bool                            // Close was called: no new listener
	loops   sync.WaitGroup                  // running listener loops
}

type waiter struct {
	ch     chan struct{}
	closed bool // guarded by watchHub.mu
}

type listener struct {
	conn   *pgx.Conn
	cancel context.CancelFunc
}

// Close stops the store's listener (see Watch), if one is running, and
// waits for its connection to close; waiters still registered are woken
// and fall back to polling. It does not close the pool, which is the
// caller's. Close is optional — the listener closes itself 250 ms after its
// last waiter leaves — and meant for shutdown and tests; Claim, Complete and
// the other store methods keep working after it, Watch does not watch.
func (s *Store) Close() {
	h := s.watch
	h.mu.Lock()
	h.closed = true
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	if l := h.l; l != nil {
		h.l = nil
		h.wakeAll()
		l.cancel()
	}
	h.mu.Unlock()
	h.loops.Wait()
}

// wakeAll wakes every registered waiter. Call with mu held.
func (h *watchHub) wakeAll() {
	for _, set := range h.waiters {
		for w := range set {
			w.wake()
		}
	}
}

func newWatchHub(s *Store) *watchHub {
	sum := sha256.Sum256([]byte(s.names.table))
	return &watchHub{
		s:       s,
		channel: "idem_" + hex.EncodeToString(sum[:12]),
		waiters: map[string]map[*waiter]struct{}{},
	}
}

// notifyPayload identifies (scope, key) in a NOTIFY without revealing it to
// other sessions LISTENing on the channel: a truncated SHA-256 of the
// length-prefixed pair.
func notifyPayload(scope, key string) string {
	h := sha256.New()
	h.Write([]byte(strconv.Itoa(len(scope))))
	h.Write([]byte{':'})
	h.Write([]byte(scope))
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

var _ storekit.Watcher = (*Store)(nil)

// Watch implements storekit.Watcher: the returned channel is closed when the
// in-flight record (scope, key) completes or fails, or at once when it is
// not in flight any more. If the listener cannot be started or the record
// cannot be marked (database unreachable, ctx done), Watch returns a nil
// channel and the engine polls instead. The release function is never nil
// and safe to call more than once.
func (s *Store) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	h := s.watch
	payload := notifyPayload(scope, key)
	w := &waiter{ch: make(chan struct{})}

	h.mu.Lock()
	set := h.waiters[payload]
	if set == nil {
		set = map[*waiter]struct{}{}
		h.waiters[payload] = set
	}
	set[w] = struct{}{}
	h.n++
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	running := h.l != nil
	h.mu.Unlock()

	var once sync.Once
	release := func() { once.Do(func() { h.remove(payload, w) }) }

	if !running {
		if err := h.start(ctx); err != nil {
			release()
			return nil, release
		}
	}
	// The listener is LISTENing: mark the record. Any complete or fail
	// committed after this mark notifies.
	tag, err := s.pool.Exec(ctx, s.sql.mark, scope, key)
	if err != nil {
		release()
		return nil, release
	}
	if tag.RowsAffected() == 0 {
		// Not in flight any more (or not yet): a change to look at now.
		h.mu.Lock()
		w.wake()
		h.mu.Unlock()
	}
	return w.ch, release
}

// wake closes w's channel once. Call with watchHub.mu held.
func (w *waiter) wake() {
	if !w.closed {
		w.closed = true
		close(w.ch)
	}
}

// remove unregisters w; the last waiter to leave schedules the listener's
// stop.
func (h *watchHub) remove(payload string, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.waiters[payload]
	if _, ok := set[w]; !ok {
		return
	}
	delete(set, w)
	if len(set) == 0 {
		delete(h.waiters, payload)
	}
	h.n--
	if h.n == 0 && h.l != nil && h.idle == nil {
		l := h.l
		h.idle = time.AfterFunc(listenLinger, func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.n == 0 && h.l == l {
				l.cancel() // the loop closes the connection and exits
				h.l = nil
				h.idle = nil
			}
		})
	}
}

// start connects and LISTENs, unless a listener is running or nobody waits
// any more.
func (h *watchHub) start(ctx context.Context) error {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	h.mu.Lock()
	skip, closed := h.l != nil || h.n == 0, h.closed
	h.mu.Unlock()
	if closed {
		return errors.New("pgstore: watch: store closed")
	}
	if skip {
		return nil
	}
	cc, err := h.s.listenConnConfig()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, listenTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cc)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{h.channel}.Sanitize()); err != nil {
		closeConn(conn)
		return err
	}
	lctx, lcancel := context.WithCancel(context.Background())
	l := &listener{conn: conn, cancel: lcancel}
	h.mu.Lock()
	if h.n == 0 || h.closed { // everyone left, or Close, while we connected
		h.mu.Unlock()
		lcancel()
		closeConn(conn)
		return errors.New("pgstore: watch: no waiters left")
	}
	h.l = l
	h.loops.Add(1)
	h.mu.Unlock()
	go h.loop(lctx, l)
	return nil
}

// loop delivers notifications until the listener is stopped or its
// connection fails; then every waiter still registered is woken (it reads
// the record again and, if it still waits, starts a new listener).
func (h *watchHub) loop(ctx context.Context, l *listener) {
	defer h.loops.Done()
	defer closeConn(l.conn)
	for {
		n, err := l.conn.WaitForNotification(ctx)
		h.mu.Lock()
		if err != nil {
			if h.l == l {
				h.l = nil
				h.wakeAll()
			}
			h.mu.Unlock()
			l.cancel()
			return
		}
		for w := range h.waiters[n.Payload] {
			w.wake()
		}
		h.mu.Unlock()
	}
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// fenced runs a fenced complete or fail statement, which returns the
// record's waiters flag when the fence matched.
func fenced(ctx context.Context, q querier, sql string, args ...any) (matched, waiters bool, err error) {
	if err := q.QueryRow(ctx, sql, args...).Scan(&waiters); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return false, false, nil
		}
		return false, false, err
	}
	return true, waiters, nil
}

// notify wakes the waiters of (scope, key), in every process, after its
// complete or fail has committed. Best effort: a waiter that misses it
// polls.
func (s *Store) notify(ctx context.Context, scope, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), notifyTimeout)
	defer cancel()
	_, _ = s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", s.watch.channel, notifyPayload(scope, key))
}
