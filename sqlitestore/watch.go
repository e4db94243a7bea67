package sqlitestore

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

var _ storekit.Watcher = (*Store)(nil)

// watchers wakes duplicates waiting in wait mode. A change made through
// this Store wakes the watchers of its key at once. A change made by
// another process (or another Store on the same file) is seen by a poller
// that runs only while someone watches: every poll interval it reads
// PRAGMA data_version on one connection it holds, a number SQLite changes
// whenever another connection commits, and wakes every watcher when it
// moved (spurious wake-ups are allowed, missed ones are not).
type watchers struct {
	s      *Store
	mu     sync.Mutex
	m      map[watchKey]map[*watch]struct{}
	n      int
	stop   chan struct{} // closes the running poller; nil when none runs
	done   chan struct{}
	closed bool
}

type watchKey struct{ scope, key string }

type watch struct {
	ch   chan struct{}
	once sync.Once
}

func (w *watch) fire() { w.once.Do(func() { close(w.ch) }) }

func (ws *watchers) init(s *Store) {
	ws.s = s
	ws.m = map[watchKey]map[*watch]struct{}{}
}

// Watch implements storekit.Watcher.
func (s *Store) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	ws := &s.watch
	w := &watch{ch: make(chan struct{})}
	k := watchKey{scope, key}
	ws.mu.Lock()
	if ws.closed || ctx.Err() != nil {
		ws.mu.Unlock()
		w.fire()
		return w.ch, func() {}
	}
	set := ws.m[k]
	if set == nil {
		set = map[*watch]struct{}{}
		ws.m[k] = set
	}
	set[w] = struct{}{}
	ws.n++
	if ws.stop == nil {
		ws.stop, ws.done = make(chan struct{}), make(chan struct{})
		go ws.poll(ws.stop, ws.done)
	}
	ws.mu.Unlock()
	var once sync.Once
	return w.ch, func() { once.Do(func() { ws.remove(k, w) }) }
}

func (ws *watchers) remove(k watchKey, w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if set := ws.m[k]; set != nil {
		if _, ok := set[w]; ok {
			delete(set, w)
			ws.n--
			if len(set) == 0 {
				delete(ws.m, k)
			}
		}
	}
	if ws.n == 0 && ws.stop != nil {
		close(ws.stop) // the poller ends on its own; Close waits for it
		ws.stop = nil
	}
}

// notify wakes the watchers of (scope, key).
func (ws *watchers) notify(scope, key string) {
	ws.mu.Lock()
	set := ws.m[watchKey{scope, key}]
	for w := range set {
		w.fire()
	}
	ws.mu.Unlock()
}

func (ws *watchers) notifyAll() {
	ws.mu.Lock()
	for _, set := range ws.m {
		for w := range set {
			w.fire()
		}
	}
	ws.mu.Unlock()
}

// poll runs while someone watches. A failing poll wakes everyone: their
// poll (a claim) then reports the error or the change.
func (ws *watchers) poll(stop, done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
		case <-done:
		}
		cancel()
	}()
	var (
		conn *sql.Conn
		last int64 = -1
	)
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	t := time.NewTicker(ws.s.cfg.poll)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if conn == nil {
			c, err := ws.s.db.Conn(ctx)
			if err != nil {
				ws.notifyAll()
				continue
			}
			conn, last = c, -1
		}
		var v int64
		if err := conn.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
			_ = conn.Close()
			conn = nil
			ws.notifyAll()
			continue
		}
		// The first read has no baseline: a commit between a Watch and
		// it would be missed, so it wakes everyone (once per poller).
		if v != last {
			ws.notifyAll()
		}
		last = v
	}
}

func (ws *watchers) close() {
	ws.mu.Lock()
	ws.closed = true
	stop, done := ws.stop, ws.done
	ws.stop = nil
	for _, set := range ws.m {
		for w := range set {
			w.fire()
		}
	}
	ws.mu.Unlock()
	if stop != nil {
		close(stop)
	}
	if done != nil {
		<-done
	}
}
