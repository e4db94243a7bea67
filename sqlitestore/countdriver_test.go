package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
)

// countedDB opens a fresh database file through a driver that counts the
// statements the store runs on it (executions, BEGIN, COMMIT, ROLLBACK;
// not preparations: SQLite is in-process, there is no round trip to count).
func countedDB(t *testing.T) (*sql.DB, *stmtCounter) {
	plain, _ := newDB(t)
	c := &stmtCounter{}
	db := sql.OpenDB(&countingConnector{drv: plain.Driver(), dsn: dsn(filepath.Join(t.TempDir(), "idem.db"), DefaultBusyTimeoutMS), c: c})
	t.Cleanup(func() { _ = db.Close() })
	return db, c
}

type stmtCounter struct {
	mu  sync.Mutex
	ops []string
}

func (c *stmtCounter) add(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops = append(c.ops, op)
}

func (c *stmtCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops = nil
}

func (c *stmtCounter) Count() (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	by := map[string]int{}
	for _, op := range c.ops {
		by[op]++
	}
	var parts []string
	for k, v := range by {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return len(c.ops), fmt.Sprint(parts)
}

type countingConnector struct {
	drv driver.Driver
	dsn string
	c   *stmtCounter
}

func (cc *countingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := cc.drv.Open(cc.dsn)
	if err != nil {
		return nil, err
	}
	return &countingConn{conn.(sqliteConn), cc.c}, nil
}

func (cc *countingConnector) Driver() driver.Driver { return cc.drv }

// sqliteConn is what modernc.org/sqlite's connection implements.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
}

type countingConn struct {
	sqliteConn
	c *stmtCounter
}

func (cc *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	cc.c.add("begin")
	tx, err := cc.sqliteConn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return countingTx{tx, cc.c}, nil
}

func (cc *countingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	st, err := cc.sqliteConn.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return countingStmt{st.(sqliteStmt), cc.c}, nil
}

func (cc *countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	cc.c.add("exec")
	return cc.sqliteConn.ExecContext(ctx, q, args)
}

func (cc *countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	cc.c.add("query")
	return cc.sqliteConn.QueryContext(ctx, q, args)
}

type countingTx struct {
	driver.Tx
	c *stmtCounter
}

func (t countingTx) Commit() error   { t.c.add("commit"); return t.Tx.Commit() }
func (t countingTx) Rollback() error { t.c.add("rollback"); return t.Tx.Rollback() }

type sqliteStmt interface {
	driver.Stmt
	driver.StmtExecContext
	driver.StmtQueryContext
}

type countingStmt struct {
	sqliteStmt
	c *stmtCounter
}

func (s countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.c.add("exec")
	return s.sqliteStmt.ExecContext(ctx, args)
}

func (s countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.c.add("query")
	return s.sqliteStmt.QueryContext(ctx, args)
}
