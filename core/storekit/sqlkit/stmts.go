package sqlkit

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// StmtCache prepares each query once on a pool and keeps it until Close;
// database/sql then re-prepares it on each connection that runs it, once.
// It is safe for concurrent use.
type StmtCache struct {
	db     *sql.DB
	mu     sync.Mutex
	m      map[string]*sql.Stmt
	closed bool
}

// NewStmtCache returns an empty cache preparing on db.
func NewStmtCache(db *sql.DB) *StmtCache {
	return &StmtCache{db: db, m: map[string]*sql.Stmt{}}
}

// Get returns the prepared statement for query, preparing it on first use.
// After Close it returns an error.
func (c *StmtCache) Get(ctx context.Context, query string) (*sql.Stmt, error) {
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
func (c *StmtCache) Prepared(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[query]
}

// Close closes every statement; later calls to Get fail.
func (c *StmtCache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.m {
		_ = st.Close()
	}
	c.m = nil
	c.closed = true
}
