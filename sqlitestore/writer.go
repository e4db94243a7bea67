package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// writer serialises this Store's writes in Go and commits them in groups.
//
// SQLite has one writer per file; a connection that finds the lock taken
// sleeps in SQLite's busy handler (1, 2, 5, 10 … 100ms steps) and polls
// again, so writers of one process that contend through the lock lose
// milliseconds per write. Queueing here hands the lock over at once; only
// writers in other processes (and a lease transaction, see Tx) still meet
// the busy handler.
//
// With synchronous=FULL each commit is an fsync, and the writes of one
// process queue behind each other anyway: so whoever takes the slot runs
// every write queued by then in one transaction, each in a savepoint of its
// own, and commits them with one fsync, as PostgreSQL shares one WAL flush
// among concurrent commits. A write alone is its own transaction. Each
// write gets the answer it would have got alone: its savepoint rolls back
// on its own error without touching the others, and none is answered
// before the commit that makes it durable. If the shared transaction
// cannot go on or commit, the writes it held run again one by one.
type writer struct {
	slot  chan struct{} // held by the goroutine writing
	db    *sql.DB
	alone bool // every write its own transaction (withoutGroupCommit)

	mu    sync.Mutex
	queue []*writeOp
}

// writeOp is one queued write: fn runs in a write transaction (its
// context is the group's, not cancelled by the caller's).
type writeOp struct {
	fn   func(ctx context.Context, tx *sql.Tx) error
	ctx  context.Context
	err  error
	done chan struct{}
}

// groupMax bounds the writes of one transaction.
const groupMax = 64

// errDiscard, returned by a write, rolls back what it wrote and answers
// nil: a write that found nothing to change (a claim lost to another).
var errDiscard = errors.New("sqlitestore: nothing to keep")

// errCommit marks the failure of the commit of a write's transaction.
var errCommit = errors.New("commit")

func newWriter(db *sql.DB) *writer { return &writer{slot: make(chan struct{}, 1), db: db} }

// lock takes the slot for a write of the caller's own, or returns ctx's
// error.
func (w *writer) lock(ctx context.Context) error {
	select {
	case w.slot <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *writer) unlock() { <-w.slot }

// write runs fn in a write transaction on the writer's database, shared
// with the writes queued beside it, and returns once that transaction
// committed (nil), or with fn's error, or the transaction's (errCommit
// when its commit failed). fn may run more than once (the shared
// transaction failed): it must set its results afresh each time. ctx
// bounds the wait in the queue; once a transaction has taken the write, it
// runs to its end.
func (w *writer) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	op := &writeOp{fn: fn, ctx: ctx, done: make(chan struct{})}
	w.mu.Lock()
	w.queue = append(w.queue, op)
	w.mu.Unlock()
	for {
		select {
		case <-op.done:
			return op.err
		case w.slot <- struct{}{}:
			w.mu.Lock()
			n := min(len(w.queue), groupMax)
			group := slices.Clone(w.queue[:n])
			w.queue = slices.Delete(w.queue, 0, n)
			w.mu.Unlock()
			if len(group) > 0 {
				w.run(group)
			}
			w.unlock()
		case <-ctx.Done():
			if w.withdraw(op) {
				return ctx.Err()
			}
			<-op.done // a transaction holds it: wait for its answer
			return op.err
		}
	}
}

// withdraw removes op from the queue; false if a transaction took it.
func (w *writer) withdraw(op *writeOp) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := slices.Index(w.queue, op); i >= 0 {
		w.queue = slices.Delete(w.queue, i, i+1)
		return true
	}
	return false
}

// queued is how many writes wait for the slot (tests).
func (w *writer) queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

// run commits group (the slot held) and answers each write.
func (w *writer) run(group []*writeOp) {
	defer func() {
		for _, op := range group {
			close(op.done)
		}
	}()
	if len(group) == 1 || w.alone {
		for _, op := range group {
			op.err = runTx(op.ctx, w.db, op.fn)
		}
		return
	}
	ctx, cancel := groupContext(group)
	defer cancel()
	answered := w.runShared(ctx, group)
	for i, op := range group {
		if !answered[i] {
			op.err = runTx(op.ctx, w.db, op.fn)
		}
	}
}

// runShared runs group in one transaction, each write in a savepoint, and
// reports which writes it answered: all of them once it commits; else only
// those that failed on their own (their error stands), and the rest run
// again alone.
func (w *writer) runShared(ctx context.Context, group []*writeOp) []bool {
	answered := make([]bool, len(group))
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return answered
	}
	if !runSavepoints(ctx, tx, group, answered) {
		_ = tx.Rollback()
		return answered
	}
	if err := tx.Commit(); err != nil {
		return answered
	}
	for i := range answered {
		answered[i] = true
	}
	return answered
}

// runSavepoints runs each write of group on tx in a savepoint, and
// reports whether tx can still commit. A write that fails on its own (a
// constraint) rolls back to its savepoint and is answered; one whose
// failure broke the transaction (a statement that ended it, an error for
// which SQLite rolls the whole transaction back) is not.
func runSavepoints(ctx context.Context, tx *sql.Tx, group []*writeOp, answered []bool) bool {
	for i, op := range group {
		if _, err := tx.ExecContext(ctx, "SAVEPOINT idem_write"); err != nil {
			return false
		}
		if err := op.fn(ctx, tx); err != nil {
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO idem_write"); rerr != nil {
				return false
			}
			if !errors.Is(err, errDiscard) {
				op.err = err
			}
			answered[i] = true
		}
		if _, err := tx.ExecContext(ctx, "RELEASE idem_write"); err != nil {
			answered[i], op.err = false, nil
			return false
		}
	}
	return true
}

// runTx runs fn in a transaction of its own: ctx bounds BEGIN (the wait
// for the write lock); fn and the commit are not interrupted (an
// interrupted write would make SQLite end the transaction behind
// database/sql's back).
func runTx(ctx context.Context, db *sql.DB, fn func(ctx context.Context, tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(context.WithoutCancel(ctx), tx); err != nil {
		_ = tx.Rollback()
		if errors.Is(err, errDiscard) {
			return nil
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%w: %w", errCommit, err)
	}
	return nil
}

// groupContext is the context of a shared transaction: none of its
// writes' cancellations, and the latest of their deadlines.
func groupContext(group []*writeOp) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(group[0].ctx)
	var latest time.Time
	for _, op := range group {
		d, ok := op.ctx.Deadline()
		if !ok {
			return context.WithCancel(ctx)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}
