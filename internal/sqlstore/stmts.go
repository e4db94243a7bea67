package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// Stmts prepares each query once on a pool and keeps it until Close;
// database/sql then re-prepares it on each connection that runs it, once.
type Stmts struct {
	db     *sql.DB
	mu     sync.Mutex
	m      map[string]*sql.Stmt
	closed bool
}

// NewStmts returns an empty cache preparing on db.
func NewStmts(db *sql.DB) *Stmts {
	return &Stmts{db: db, m: map[string]*sql.Stmt{}}
}

// Get returns the prepared statement for query, preparing it on first use.
// After Close it returns an error.
func (c *Stmts) Get(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("store is closed")
	}
	if st, ok := c.m[query]; ok {
		return st, nil
	}
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.m[query] = st
	return st, nil
}

// Prepared returns the statement for query if it was prepared already.
func (c *Stmts) Prepared(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[query]
}

// Close closes every statement; later calls to Get fail.
func (c *Stmts) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.m {
		_ = st.Close()
	}
	c.m = nil
	c.closed = true
}
