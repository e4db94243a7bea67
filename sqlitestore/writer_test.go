package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// queueWrites holds w's slot, queues one write per fn behind it, in
// order, and gives it back: the next transaction takes them all. It
// returns each write's answer.
func queueWrites(t *testing.T, w *writer, fns ...func(ctx context.Context, tx *sql.Tx) error) []error {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, w.lock(ctx))
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = w.write(ctx, fn) })
		// One by one: the transaction runs them in the order they queued.
		require.Eventually(t, func() bool { return w.queued() == i+1 }, 10*time.Second, time.Millisecond)
	}
	w.unlock()
	wg.Wait()
	return errs
}

func newWriterDB(t *testing.T) (*sql.DB, *writer) {
	t.Helper()
	db, _ := newDB(t)
	_, err := db.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)`)
	require.NoError(t, err)
	return db, newWriter(db)
}

func insert(id int, v string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO t (id, v) VALUES (?, ?)`, id, v)
		return err
	}
}

func rows(t *testing.T, db *sql.DB) map[int]string {
	t.Helper()
	rs, err := db.Query(`SELECT id, v FROM t`)
	require.NoError(t, err)
	defer rs.Close()
	out := map[int]string{}
	for rs.Next() {
		var (
			id int
			v  string
		)
		require.NoError(t, rs.Scan(&id, &v))
		out[id] = v
	}
	require.NoError(t, rs.Err())
	return out
}

func TestQueuedWritesShareOneTransaction(t *testing.T) {
	db, w := newWriterDB(t)
	var (
		mu  sync.Mutex
		txs = map[*sql.Tx]bool{}
	)
	fns := make([]func(context.Context, *sql.Tx) error, 5)
	for i := range fns {
		fns[i] = func(ctx context.Context, tx *sql.Tx) error {
			mu.Lock()
			txs[tx] = true
			mu.Unlock()
			return insert(i, "ok")(ctx, tx)
		}
	}
	for _, err := range queueWrites(t, w, fns...) {
		assert.NoError(t, err)
	}
	assert.Len(t, txs, 1, "five queued writes, one transaction")
	assert.Len(t, rows(t, db), 5)
}

func TestAFailedWriteRollsBackAloneInItsGroup(t *testing.T) {
	db, w := newWriterDB(t)
	errs := queueWrites(t, w,
		insert(1, "first"),
		func(ctx context.Context, tx *sql.Tx) error {
			// Its first row goes in, its second breaks the primary key:
			// neither may stay, and the others must.
			if err := insert(10, "half")(ctx, tx); err != nil {
				return err
			}
			return insert(1, "duplicate")(ctx, tx)
		},
		insert(2, "third"),
	)
	assert.NoError(t, errs[0])
	assert.ErrorContains(t, errs[1], "UNIQUE constraint failed")
	assert.NoError(t, errs[2])
	assert.Equal(t, map[int]string{1: "first", 2: "third"}, rows(t, db))
}

func TestADiscardedWriteAnswersNilAndKeepsNothing(t *testing.T) {
	db, w := newWriterDB(t)
	errs := queueWrites(t, w, insert(1, "kept"), func(ctx context.Context, tx *sql.Tx) error {
		if err := insert(2, "dropped")(ctx, tx); err != nil {
			return err
		}
		return errDiscard
	})
	assert.NoError(t, errs[0])
	assert.NoError(t, errs[1])
	assert.Equal(t, map[int]string{1: "kept"}, rows(t, db))
}

func TestWritesOfABrokenGroupRunAgainAlone(t *testing.T) {
	db, w := newWriterDB(t)
	var (
		mu   sync.Mutex
		runs = map[int]int{}
	)
	counted := func(id int) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			mu.Lock()
			runs[id]++
			mu.Unlock()
			return insert(id, "ok")(ctx, tx)
		}
	}
	errs := queueWrites(t, w, counted(1), func(ctx context.Context, tx *sql.Tx) error {
		// Ends the shared transaction behind database/sql's back, as a
		// deferred statement must not.
		_, err := tx.ExecContext(ctx, `ROLLBACK`)
		return err
	}, counted(2))
	assert.NoError(t, errs[0])
	assert.Error(t, errs[1], "the write that ended the transaction fails alone too")
	assert.NoError(t, errs[2])
	assert.Equal(t, map[int]string{1: "ok", 2: "ok"}, rows(t, db))
	assert.Equal(t, 2, runs[1], "row 1: in the group, then alone")
}

func TestAWriteWithdrawnFromTheQueueNeverRuns(t *testing.T) {
	_, w := newWriterDB(t)
	require.NoError(t, w.lock(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	ran := false
	errc := make(chan error, 1)
	go func() {
		errc <- w.write(ctx, func(context.Context, *sql.Tx) error { ran = true; return nil })
	}()
	require.Eventually(t, func() bool { return w.queued() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	err := <-errc
	w.unlock()
	assert.True(t, errors.Is(err, context.Canceled), "got %v", err)
	assert.False(t, ran)
	assert.Zero(t, w.queued())
}
