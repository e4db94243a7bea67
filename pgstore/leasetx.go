package pgstore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// leaseTx is the pgx.Tx that Tx hands out. It holds no connection until its
// first statement; that statement goes out in one pipeline with BEGIN
// (pgx's Batch.BeginTx), so beginning costs no round trip of its own. From
// then on every call goes to pgx's transaction on that connection. The
// store ends it (completeInTx, failInTx, rollback); the handler cannot.
type leaseTx struct {
	s *Store

	// mu guards the fields below. It is held while the first statement
	// begins the transaction, so that two first statements cannot race;
	// calls on a begun transaction run outside it, as on any pgx.Tx.
	mu    sync.Mutex
	conn  *pgx.Conn // from the first call to the end
	put   func()    // gives conn back (release)
	tx    pgx.Tx    // pgx's transaction on conn, once BEGIN was sent
	ended bool      // the lease is over: every call is refused
	// sql is the database/sql face of the transaction, when SQLTx handed
	// one out (sqltx.go): conn is then the pgx connection under it.
	sql *sqlSide
	// began: BEGIN's answer was read, the transaction began. A BEGIN that
	// never went out (ctx ended between the acquire and the send) leaves
	// tx set on an idle connection, which must not read as a transaction
	// the handler ended with SQL (endedBySQL).
	began bool

	// sqlEnd is how the handler last ended the transaction with SQL
	// (tx.Exec(ctx, "ROLLBACK"), "COMMIT"...), read from Exec's command
	// tags: pgx does not see it, and the connection would go on in
	// autocommit. Complete and Fail read it when the connection is found
	// outside a transaction (endedBySQL).
	sqlEnd atomic.Int32
	// committed: the handler sent a COMMIT that committed (its tag said
	// so), possibly AND CHAIN, the transaction going on: some of its
	// writes have landed whatever happens to the rest, so the key must
	// never be released (completeInTx, failInTx).
	committed atomic.Bool
	// xid is the transaction's id, taken in BEGIN's round trip: when the
	// handler ended the transaction in a way whose tag idem did not read
	// (Query, SendBatch, Conn...), PostgreSQL says whether it committed
	// (Store.endedOutcome).
	xid int64
}

// sqlEnd values.
const (
	sqlEndNone int32 = iota
	sqlEndCommit
	sqlEndRollback
)

// errTxEndedBySQL refuses statements on a lease transaction the handler
// ended with SQL: they would run, and commit, on their own.
var errTxEndedBySQL = errors.New("pgstore: the lease transaction was ended by the handler with SQL (COMMIT or ROLLBACK sent as a statement); idem ends it, and later statements would run outside it")

// noteTag records a COMMIT or ROLLBACK the handler sent as SQL. A
// ROLLBACK TO SAVEPOINT also answers ROLLBACK but leaves the transaction
// open: endedBySQL asks the connection, the tag only says which.
func (t *leaseTx) noteTag(tag pgconn.CommandTag) {
	switch tag.String() {
	case "COMMIT":
		t.sqlEnd.Store(sqlEndCommit)
		t.committed.Store(true)
	case "ROLLBACK":
		t.sqlEnd.Store(sqlEndRollback)
	}
}

// endedBySQL reports whether the begun transaction was ended by the
// handler's SQL: the connection is alive and idle, outside any
// transaction.
func (t *leaseTx) endedBySQL() bool {
	if t.tx == nil || t.conn == nil || !t.began {
		return false
	}
	pc := t.conn.PgConn()
	return !pc.IsClosed() && pc.TxStatus() == 'I'
}

// connLost reports whether the begun transaction's connection is closed
// (it died, or pgx closed it after an error): the transaction is over,
// rolled back unless a COMMIT of the handler's reached the server.
func (t *leaseTx) connLost() bool {
	return t.tx != nil && t.conn != nil && t.conn.PgConn().IsClosed()
}

var _ pgx.Tx = (*leaseTx)(nil)

// setIdleSQL is WithTxIdleTimeout's setting, pipelined after BEGIN.
const setIdleSQL = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`

// openLocked returns the begun transaction, nil if none was begun, or
// errTxEnded.
func (t *leaseTx) openLocked() (pgx.Tx, error) {
	if t.ended {
		return nil, errTxEnded
	}
	if t.endedBySQL() {
		return nil, errTxEndedBySQL
	}
	return t.tx, nil
}

func (t *leaseTx) acquireLocked(ctx context.Context) error {
	if t.conn != nil {
		return nil
	}
	c, err := t.s.txPool.Acquire(ctx)
	if err != nil {
		return wrap(ctx, "tx: acquire connection", err)
	}
	t.conn, t.put = c.Conn(), c.Release
	return nil
}

// beginLocked begins the transaction with its own round trip, for the calls
// that cannot carry BEGIN in a pipeline.
func (t *leaseTx) beginLocked(ctx context.Context) (pgx.Tx, error) {
	br, err := t.sendLocked(ctx, func(*pgx.Batch) {})
	if err != nil {
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, wrap(ctx, "tx: begin", err)
	}
	return t.tx, nil
}

// xidSQL takes the transaction's id at BEGIN (assigning it then rather than
// at the first write, which a transaction that writes pays anyway).
const xidSQL = `SELECT txid_current()`

// sendLocked sends BEGIN (the idle timeout, the transaction id) followed by
// what queue adds, in one round trip, and reads the results of BEGIN. The
// caller reads the rest and closes the results.
func (t *leaseTx) sendLocked(ctx context.Context, queue func(*pgx.Batch)) (pgx.BatchResults, error) {
	if err := t.acquireLocked(ctx); err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	idle := t.s.cfg.txIdle > 0
	if idle {
		b.Queue(setIdleSQL, strconv.FormatInt(t.s.txIdleMillis(), 10))
	}
	b.Queue(xidSQL)
	queue(b)
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	_, err := br.Exec() // BEGIN
	t.began = err == nil
	if err == nil && idle {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(&t.xid)
	}
	if err != nil {
		_ = br.Close()
		return nil, wrap(ctx, "tx: begin", err)
	}
	return br, nil
}

// pipelinable reports whether a statement with these arguments can go in a
// batch: pgx batches accept no query options but a QueryRewriter.
func pipelinable(args []any) bool {
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		case pgx.QueryRewriter:
		default:
			return true
		}
	}
	return true
}

// Exec runs sql in the transaction; the first statement carries BEGIN.
func (t *leaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.mu.Lock()
	if tx, err := t.openLocked(); tx != nil || err != nil {
		t.mu.Unlock()
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := tx.Exec(ctx, sql, args...)
		t.noteTag(tag)
		return tag, err
	}
	defer t.mu.Unlock()
	if !pipelinable(args) {
		tx, err := t.beginLocked(ctx)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := tx.Exec(ctx, sql, args...)
		t.noteTag(tag)
		return tag, err
	}
	br, err := t.sendLocked(ctx, func(b *pgx.Batch) { b.Queue(sql, args...) })
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	t.noteTag(tag)
	return tag, err
}

// Query runs sql in the transaction; the first statement carries BEGIN.
func (t *leaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.mu.Lock()
	if tx, err := t.openLocked(); tx != nil || err != nil {
		t.mu.Unlock()
		if err != nil {
			return errRows(err), err
		}
		return tx.Query(ctx, sql, args...)
	}
	defer t.mu.Unlock()
	if !pipelinable(args) {
		tx, err := t.beginLocked(ctx)
		if err != nil {
			return errRows(err), err
		}
		return tx.Query(ctx, sql, args...)
	}
	br, err := t.sendLocked(ctx, func(b *pgx.Batch) { b.Queue(sql, args...) })
	if err != nil {
		return errRows(err), err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return errRows(err), err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs sql in the transaction; the first statement carries BEGIN.
func (t *leaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.mu.Lock()
	tx, err := t.openLocked()
	t.mu.Unlock()
	if tx != nil && err == nil {
		return tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return rowOf{rows, err}
}

// SendBatch sends b in the transaction; a first batch carries BEGIN.
func (t *leaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.mu.Lock()
	if tx, err := t.openLocked(); tx != nil || err != nil {
		t.mu.Unlock()
		if err != nil {
			return pgx.FailedBatchResults(b, err)
		}
		return tx.SendBatch(ctx, b)
	}
	defer t.mu.Unlock()
	br, err := t.sendLocked(ctx, func(nb *pgx.Batch) { nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...) })
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return noTxResults{br}
}

// begun returns the transaction, beginning it with its own round trip if
// needed.
func (t *leaseTx) begun(ctx context.Context) (pgx.Tx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tx, err := t.openLocked(); tx != nil || err != nil {
		return tx, err
	}
	return t.beginLocked(ctx)
}

// CopyFrom runs COPY in the transaction (after BEGIN, if first).
func (t *leaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, cols, src)
}

// Begin starts a savepoint (after BEGIN, if first).
func (t *leaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

// LargeObjects returns the large objects of the transaction (begun with its
// own round trip, bounded by rollbackTimeout, if first). If it cannot be
// begun, every operation on the result fails with pgx.ErrTxClosed.
func (t *leaseTx) LargeObjects() pgx.LargeObjects {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	tx, err := t.begun(ctx)
	if err != nil {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		return pgx.FailedBatchResults(b, err).Tx().LargeObjects()
	}
	return tx.LargeObjects()
}

// Prepare prepares sql on the transaction's connection.
func (t *leaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	t.mu.Lock()
	if _, err := t.openLocked(); err != nil {
		t.mu.Unlock()
		return nil, err
	}
	if err := t.acquireLocked(ctx); err != nil {
		t.mu.Unlock()
		return nil, err
	}
	c := t.conn
	t.mu.Unlock()
	return c.Prepare(ctx, name, sql)
}

// Conn returns the connection the transaction runs on, beginning the
// transaction (its own round trip, bounded by rollbackTimeout) if no
// statement ran yet: what the handler runs on the connection itself must
// be in the transaction too, not commit on its own. nil once the lease is
// over, or if the transaction could not be begun.
func (t *leaseTx) Conn() *pgx.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	if _, err := t.begun(ctx); err != nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended || t.conn == nil {
		return nil
	}
	return t.conn
}

// Commit does nothing: idem commits. See Tx.
func (*leaseTx) Commit(context.Context) error { return ErrTxOwned }

// Rollback does nothing: idem rolls back. See Tx.
func (*leaseTx) Rollback(context.Context) error { return ErrTxOwned }

// end refuses every later call and reports whether a transaction was begun
// (the caller then owns ending it and releasing the connection). A
// connection taken without a transaction goes back to the pool. The
// database/sql face of a transaction SQLTx handed out is closed (the
// handler's *sql.Tx refuses every later call, its open rows are closed):
// from now on the store alone uses the connection.
func (t *leaseTx) end() bool {
	t.mu.Lock()
	t.ended = true
	begun := t.tx != nil
	var put func()
	if !begun && t.conn != nil {
		put = t.put
		t.conn, t.put = nil, nil
	}
	side := t.sql
	t.mu.Unlock()
	// Outside mu: closing the *sql.Tx waits for the handler's statements
	// in flight, which take mu (sqlDriverConn.check).
	if side != nil {
		side.detach()
	}
	if put != nil {
		put()
	}
	return begun
}

// rollback ends a begun transaction and releases its connection.
func (t *leaseTx) rollback(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if t.conn.PgConn().TxStatus() != 'I' {
		// A failed rollback closes the connection (pgx), which ends the
		// transaction server-side just the same.
		_ = t.tx.Rollback(rctx)
	}
	t.release()
}

// release returns the connection to the pool; pgxpool destroys one that is
// still inside a transaction or broken.
func (t *leaseTx) release() {
	if t.conn != nil {
		t.put()
		t.conn, t.put = nil, nil
	}
}

// batchRows are the rows of a first statement sent in a pipeline with
// BEGIN: when they are done, the pipeline is closed too.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

func (r *batchRows) Close() { r.finish() }

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *batchRows) finish() {
	if !r.closed {
		r.closed = true
		r.Rows.Close()
		r.err = r.br.Close()
	}
}

// rowOf is QueryRow over rows, as pgx's own.
type rowOf struct {
	rows pgx.Rows
	err  error
}

func (r rowOf) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errRows are the rows of a statement that could not be sent: pgx's own,
// closed, reporting err.
func errRows(err error) pgx.Rows {
	rows, _ := pgx.FailedBatchResults(&pgx.Batch{}, err).Query()
	return rows
}

// noTxResults are the results of the handler's first batch: it carried
// BEGIN, but the handler's batch did not begin a transaction of its own.
type noTxResults struct{ pgx.BatchResults }

func (noTxResults) Tx() pgx.Tx { return nil }
