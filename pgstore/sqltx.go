package pgstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// errTxBegunByPgx: SQLTx after Tx began the transaction on a pgx connection,
// which database/sql cannot be given.
var errTxBegunByPgx = errors.New("pgstore: sql tx: the lease transaction was already begun through Tx (pgx); call SQLTx before the first statement sent through Tx (Tx then returns the same transaction), or use Tx only")

// SQLTx is Tx for database/sql: it returns the business transaction of the
// current idem execution as a *sql.Tx, for the libraries that take one
// (GORM, sqlx, ent, bun; see "With an ORM" in the README). It is the same
// transaction Tx gives, with the same guarantees: Complete commits the
// stored response in it, in one round trip with the COMMIT; Fail rolls it
// back; a lost lease rolls the handler's writes back. Calling SQLTx twice
// with contexts carrying the same lease returns the same *sql.Tx, and Tx
// called after SQLTx returns a pgx.Tx on the same transaction. SQLTx after
// a statement sent through Tx returns an error: that transaction runs on a
// pgx connection database/sql cannot be handed.
//
// Unlike Tx, SQLTx begins the transaction at once: it takes a connection
// from the store's transaction pool (WithTxPool) through pgx's stdlib
// driver and sends BEGIN, one round trip (with WithTxIdleTimeout's setting
// and the transaction's id in the same round trip). The store's own
// statements (the fenced complete and COMMIT, the rollback) go to that
// same connection, under database/sql, as for Tx.
//
// The handler does its writes in the transaction and neither commits nor
// rolls it back: Commit and Rollback return ErrTxOwned and do nothing to
// the transaction, so `defer tx.Rollback()` is harmless. database/sql
// marks the *sql.Tx done all the same, so later statements on it return
// sql.ErrTxDone and none of them runs outside idem's transaction; what
// the handler wrote before stays in it, and commits with the response
// only if the handler answers a final status (a handler that reports the
// error it got from Commit answers 500: idem rolls back and releases the
// key). A handler that ends the transaction with SQL (Exec "COMMIT" or
// "ROLLBACK") is handled as for Tx: its later statements are refused; after
// a ROLLBACK, Complete records nothing, releases the key and wraps
// storekit.ErrNotCommitted; after a COMMIT the writes have landed, the
// response is recorded on its own, and a Fail completes the record as not
// retained so a retry does not run them again.
//
// The ctx passed to SQLTx bounds taking the connection and BEGIN; the
// transaction itself lasts until Complete or Fail, whatever happens to
// ctx (database/sql would roll back a transaction whose context ends).
// As with any *sql.Tx, it is not for use after the handler has returned.
func SQLTx(ctx context.Context) (*sql.Tx, error) {
	return withLeaseTx(ctx, "sql tx", func(t *leaseTx) (*sql.Tx, error) { return t.sqlTx(ctx) })
}

// sqlSide is the database/sql face of a lease transaction: a *sql.DB of its
// own (one connection, taken from the store's transaction pool by pgx's
// stdlib connector), the *sql.Conn holding that connection, and the *sql.Tx
// the handler gets. Its driver (sqlDriverConn) begins the transaction the
// way Tx does (leaseTx.beginLocked), refuses the handler's Commit and
// Rollback, and refuses statements once the lease is over or the handler
// ended the transaction with SQL.
type sqlSide struct {
	t     *leaseTx
	inner driver.Connector
	begin context.Context // SQLTx's: bounds BEGIN (database/sql gets one without cancellation)

	db *sql.DB
	c  *sql.Conn
	tx *sql.Tx
	// closing: the store ends database/sql's transaction (detach); the
	// driver's Commit then does nothing and succeeds.
	closing atomic.Bool
}

// sqlTx opens the database/sql face of t and begins the transaction, or
// returns the one already open.
func (t *leaseTx) sqlTx(ctx context.Context) (*sql.Tx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return nil, ErrLeaseFinished
	}
	if t.sql != nil {
		return t.sql.tx, nil
	}
	if t.conn != nil {
		return nil, errTxBegunByPgx
	}
	side := &sqlSide{t: t, inner: stdlib.GetPoolConnector(t.s.txPool), begin: ctx}
	side.db = sql.OpenDB(side)
	side.db.SetMaxIdleConns(0) // the connection goes back to the pool when c closes
	c, err := side.db.Conn(ctx)
	if err != nil {
		_ = side.db.Close()
		return nil, wrap(ctx, "sql tx: acquire connection", err)
	}
	side.c = c
	// With t.mu held: the driver's BeginTx runs in this goroutine and sets
	// t.conn and t.tx (sqlDriverConn.BeginTx).
	tx, err := c.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		// Nothing of the handler ran: as if never begun. The connection
		// goes back to the pool, destroyed if BEGIN left it in a
		// transaction.
		t.conn, t.put, t.tx, t.began, t.xid = nil, nil, nil, false, 0
		side.close()
		return nil, err // wrapped by beginLocked
	}
	side.tx = tx
	t.sql = side
	return tx, nil
}

// Connect takes a connection from the transaction pool (pgx's stdlib
// connector) and wraps it in the lease's driver connection.
func (x *sqlSide) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := x.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	c, ok := dc.(*stdlib.Conn)
	if !ok {
		_ = dc.Close()
		return nil, fmt.Errorf("pgstore: sql tx: pgx's stdlib connector gave a %T, not a *stdlib.Conn", dc)
	}
	return &sqlDriverConn{Conn: c, side: x}, nil
}

// Driver implements driver.Connector.
func (x *sqlSide) Driver() driver.Driver { return x.inner.Driver() }

// detach ends database/sql's side of the transaction without touching the
// server: the *sql.Tx is marked done (the handler's later calls get
// sql.ErrTxDone, its open rows are closed) and the connection is idle in
// database/sql's eyes, the store's alone until close.
func (x *sqlSide) detach() {
	x.closing.Store(true)
	if x.tx != nil {
		_ = x.tx.Commit() // the driver's Commit does nothing now; ErrTxDone if the handler called Commit or Rollback
	}
}

// close detaches and gives the connection back to the pool: pgxpool
// destroys one still inside a transaction.
func (x *sqlSide) close() {
	x.detach()
	if x.c != nil {
		_ = x.c.Close()
	}
	_ = x.db.Close()
}

// sqlDriverConn is pgx's stdlib connection with the lease's transaction
// rules: its BeginTx begins the lease transaction, and its statements are
// refused once the lease is over or the handler ended the transaction with
// SQL (they would run, and commit, on their own).
type sqlDriverConn struct {
	*stdlib.Conn
	side *sqlSide
}

var (
	_ driver.ConnBeginTx        = (*sqlDriverConn)(nil)
	_ driver.ExecerContext      = (*sqlDriverConn)(nil)
	_ driver.QueryerContext     = (*sqlDriverConn)(nil)
	_ driver.ConnPrepareContext = (*sqlDriverConn)(nil)
	_ driver.SessionResetter    = (*sqlDriverConn)(nil)
	_ driver.NamedValueChecker  = (*sqlDriverConn)(nil)
)

// BeginTx begins the lease transaction on this connection as Tx does (BEGIN
// pipelined with the idle timeout and the transaction id). It runs inside
// SQLTx, which holds the transaction's mutex.
func (c *sqlDriverConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	t := c.side.t
	if t.conn != nil {
		return nil, errors.New("pgstore: sql tx: the lease transaction is already begun")
	}
	t.conn, t.put = c.Conn.Conn(), c.side.close
	ctx := c.side.begin
	c.side.begin = nil // not kept past BEGIN
	if ctx == nil {
		ctx = context.Background()
	}
	if _, err := t.beginLocked(ctx); err != nil {
		return nil, err
	}
	return sqlDriverTx{c.side}, nil
}

// check refuses a statement once the lease is over or the handler ended
// the transaction with SQL.
func (c *sqlDriverConn) check() error {
	t := c.side.t
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := t.openLocked()
	return err
}

// ExecContext runs query as pgx's stdlib does, and reads its command tag:
// a COMMIT the handler sent as SQL (possibly AND CHAIN) is known for sure.
func (c *sqlDriverConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	pc := c.Conn.Conn()
	if pc.IsClosed() {
		return nil, driver.ErrBadConn
	}
	vals := make([]any, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	tag, err := pc.Exec(ctx, query, vals...)
	c.side.t.noteTag(tag)
	if err != nil && pgconn.SafeToRetry(err) {
		return nil, driver.ErrBadConn
	}
	return driver.RowsAffected(tag.RowsAffected()), err
}

// QueryContext runs query as pgx's stdlib does.
func (c *sqlDriverConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return c.Conn.QueryContext(ctx, query, args)
}

// PrepareContext prepares query as pgx's stdlib does; the statement runs
// through c, under the same rules.
func (c *sqlDriverConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	st, err := c.Conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	ps, ok := st.(*stdlib.Stmt)
	if !ok {
		_ = st.Close()
		return nil, fmt.Errorf("pgstore: sql tx: pgx's stdlib prepared a %T, not a *stdlib.Stmt", st)
	}
	return &sqlDriverStmt{Stmt: ps, c: c, query: query}, nil
}

// Prepare is PrepareContext without a deadline.
func (c *sqlDriverConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// Begin is refused: the lease transaction is begun by SQLTx only.
func (c *sqlDriverConn) Begin() (driver.Tx, error) {
	return nil, errors.New("pgstore: sql tx: the lease transaction is begun by SQLTx")
}

// sqlDriverStmt is a prepared statement of sqlDriverConn: pgx's stdlib runs
// a prepared statement by its text (its name), so it runs through the
// connection's ExecContext and QueryContext, under their rules.
type sqlDriverStmt struct {
	*stdlib.Stmt
	c     *sqlDriverConn
	query string
}

var (
	_ driver.StmtExecContext  = (*sqlDriverStmt)(nil)
	_ driver.StmtQueryContext = (*sqlDriverStmt)(nil)
)

// ExecContext runs the statement.
func (s *sqlDriverStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.c.ExecContext(ctx, s.query, args)
}

// QueryContext runs the statement.
func (s *sqlDriverStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.c.QueryContext(ctx, s.query, args)
}

// sqlDriverTx is the driver side of the *sql.Tx SQLTx hands out: idem ends
// the transaction, not the handler.
type sqlDriverTx struct{ side *sqlSide }

// Commit refuses (ErrTxOwned) unless the store is ending database/sql's
// side of the transaction (detach), when it does nothing and succeeds.
func (x sqlDriverTx) Commit() error {
	if x.side.closing.Load() {
		return nil
	}
	return ErrTxOwned
}

// Rollback refuses (ErrTxOwned) unless the store is ending database/sql's
// side of the transaction, when it does nothing and succeeds.
func (x sqlDriverTx) Rollback() error {
	return x.Commit()
}
