package sqlitestore

import "context"

// writer serialises this Store's writes in Go. SQLite has one writer per
// file; a connection that finds the lock taken sleeps in SQLite's busy
// handler (1, 2, 5, 10 … 100ms steps) and polls again, so writers of one
// process that contend through the lock lose milliseconds per write
// (before this, at 4 workers 3.6× the naive floor's time per pair;
// BENCHMARKS.md §2 has today's). Queueing here hands the lock over at once; only writers in
// other processes (and a lease transaction, see Tx) still meet the busy
// handler. A slot, not a mutex, so that waiting honours ctx.
type writer chan struct{}

func newWriter() writer { return make(writer, 1) }

// lock takes the slot, or returns ctx's error.
func (w writer) lock(ctx context.Context) error {
	select {
	case w <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w writer) unlock() { <-w }
