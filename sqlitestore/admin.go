package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// The operator's statements (storekit.Admin, used by cmd/idemctl). Stuck and
// Stats scan the records table; the others touch one row by primary key.
// Every instant is SQLite's.

var _ storekit.Admin = (*Store)(nil)

// Inspect implements storekit.Admin: the record with its response and when it
// completed. One SELECT.
func (s *Store) Inspect(ctx context.Context, scope, key string) (storekit.AdminRecord, error) {
	q := strings.Replace(s.sql.get, "\nFROM ", ", completed_at\nFROM ", 1)
	var (
		ar        storekit.AdminRecord
		now       int64
		completed sql.NullInt64
	)
	r, err := scanRecord(s.db.QueryRowContext(ctx, q, b(scope), b(key)), &now, &completed)
	if errors.Is(err, sql.ErrNoRows) {
		return ar, fmt.Errorf("sqlitestore: inspect: %w", storekit.ErrNotFound)
	}
	if err != nil {
		return ar, wrap(ctx, "inspect", err)
	}
	r.Scope, r.Key = scope, key
	ar.Record, ar.Now, ar.CompletedAt = r, fromMicros(now), sqlkit.NullTime(completed)
	return ar, nil
}

// Stuck implements storekit.Admin: processing records whose lease lapsed, the
// longest lapsed first, without responses. One SELECT.
func (s *Store) Stuck(ctx context.Context, limit int) ([]storekit.AdminRecord, error) {
	if limit < 1 {
		return nil, fmt.Errorf("sqlitestore: stuck: limit %d must be positive", limit)
	}
	now := s.cfg.clock()
	q := "SELECT method, route, fingerprint, status, token, locked_until, created_at, expires_at,\n" +
		"       NULL, NULL, NULL, 0, " + now + ", scope, key\n" +
		"FROM " + s.names.table + "\nWHERE status = 'processing' AND locked_until <= " + now + "\n" +
		"ORDER BY locked_until, scope, key\nLIMIT ?"
	rows, err := s.db.QueryContext(ctx, q, limit)
	if err != nil {
		return nil, wrap(ctx, "stuck", err)
	}
	defer rows.Close()
	out, err := sqlkit.ScanStuck(rows)
	if err != nil {
		return nil, wrap(ctx, "stuck", err)
	}
	return out, nil
}

// Release implements storekit.Admin: a fenced UPDATE to failed. When nothing
// matched, one more read tells why.
func (s *Store) Release(ctx context.Context, f storekit.Fence, live bool) error {
	q := "UPDATE " + s.names.table + " SET status = 'failed'\nWHERE scope = ? AND key = ? AND token = ? AND status = 'processing'"
	if !live {
		q += " AND locked_until <= " + s.cfg.clock()
	}
	res, err := s.db.ExecContext(ctx, q, b(f.Scope), b(f.Key), f.Token)
	if err != nil {
		return wrap(ctx, "release", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return wrap(ctx, "release", err)
	} else if n > 0 {
		s.watch.notify(f.Scope, f.Key)
		return nil
	}
	r, err := s.Inspect(ctx, f.Scope, f.Key)
	return fmt.Errorf("sqlitestore: release: %w", storekit.ReleaseRefused(r, err, f, live))
}

// Stats implements storekit.Admin. One aggregate SELECT against one clock read.
func (s *Store) Stats(ctx context.Context) (storekit.Stats, error) {
	const minute, hour, day = int64(time.Minute / time.Microsecond), int64(time.Hour / time.Microsecond), int64(24 * time.Hour / time.Microsecond)
	q := fmt.Sprintf("SELECT v.n, status, COUNT(*),\n"+
		"  SUM(created_at > v.n - %[1]d),\n"+
		"  SUM(created_at <= v.n - %[1]d AND created_at > v.n - %[2]d),\n"+
		"  SUM(created_at <= v.n - %[2]d AND created_at > v.n - %[3]d),\n"+
		"  SUM(created_at <= v.n - %[3]d),\n"+
		"  SUM(expires_at <= v.n),\n"+
		"  SUM(status = 'processing' AND locked_until <= v.n),\n"+
		"  MIN(created_at)\n"+
		"FROM (SELECT %[4]s AS n) v LEFT JOIN %[5]s ON 1\n"+
		"GROUP BY status ORDER BY status", minute, hour, day, s.cfg.clock(), s.names.table)
	rows, err := s.db.QueryContext(ctx, q)
	if err != nil {
		return storekit.Stats{}, wrap(ctx, "stats", err)
	}
	defer rows.Close()
	var st storekit.Stats
	for rows.Next() {
		var (
			c      storekit.StatusCount
			now    int64
			status sql.NullString
			oldest sql.NullInt64
			counts [7]sql.NullInt64
		)
		if err := rows.Scan(&now, &status, &counts[0], &counts[1], &counts[2], &counts[3], &counts[4],
			&counts[5], &counts[6], &oldest); err != nil {
			return storekit.Stats{}, wrap(ctx, "stats", err)
		}
		st.Now = fromMicros(now)
		if !status.Valid {
			continue // the empty table's one row: only the clock
		}
		c.Status, c.Oldest = storekit.Status(status.String), sqlkit.NullTime(oldest)
		c.Count, c.UnderMinute, c.UnderHour, c.UnderDay = counts[0].Int64, counts[1].Int64, counts[2].Int64, counts[3].Int64
		c.Older, c.Expired, c.Stuck = counts[4].Int64, counts[5].Int64, counts[6].Int64
		st.ByStatus = append(st.ByStatus, c)
	}
	if err := rows.Err(); err != nil {
		return storekit.Stats{}, wrap(ctx, "stats", err)
	}
	return st, nil
}
