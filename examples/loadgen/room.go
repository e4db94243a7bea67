package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// roomWaiter keeps the servers that are not being driven from starving the
// one that is: every server starts up front with its own pool, and idle pools
// close only after pool_max_conn_idle_time (idleParams), so on a fast box the
// previous server's connections are still open when the next one warms up.
// Six servers of 16 connections exceed PostgreSQL's default max_connections
// (100), and the driven server then answers "too many clients" as 500/503.
// Before each server is driven, wait (unmeasured) until the database has room
// for its whole pool.
//
// On MySQL it only names the server process whose CPU is measured (cpu.go).
type roomWaiter struct {
	conn  *pgx.Conn
	max   int
	dbPID int // MySQL/MariaDB: the local mysqld's pid, 0 if not found
}

func newRoomWaiter(ctx context.Context, dsn string) (*roomWaiter, error) {
	if isMySQL(dsn) {
		// Room is not checked on MySQL (its pools are polled by
		// database/sql and its default max_connections is 151).
		return &roomWaiter{dbPID: mysqldPID(ctx, dsn)}, nil
	}
	if isSQLite(dsn) {
		return nil, nil // no server
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	var maxConns, reserved int
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int`).Scan(&maxConns, &reserved); err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("max_connections: %w", err)
	}
	return &roomWaiter{conn: conn, max: maxConns - reserved}, nil
}

// wait returns once pool more connections fit, or after 20 s (then the run
// goes on, and errors, if any, show in the report's "other" column).
func (w *roomWaiter) wait(ctx context.Context, pool int) error {
	if w == nil || w.conn == nil {
		return nil
	}
	deadline := time.Now().Add(20 * time.Second) // idle pools close after 15 s
	for {
		var used int
		if err := w.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&used); err != nil {
			return fmt.Errorf("count connections: %w", err)
		}
		if used+pool <= w.max || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (w *roomWaiter) close() {
	if w != nil && w.conn != nil {
		_ = w.conn.Close(context.Background())
	}
}
