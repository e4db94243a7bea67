package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// The operator's statements (storekit.Admin, used by cmd/idemctl). They are off
// the hot path: Stuck and Stats scan the records table (no index serves
// them; on a large table run them rarely, or on a replica), the others
// touch one row by primary key. Every instant is the database's.

var _ storekit.Admin = (*Store)(nil)

// Inspect implements storekit.Admin: the record with its response and when it
// completed. One SELECT (causal on Galera, as Get).
func (s *Store) Inspect(ctx context.Context, scope, key string) (storekit.AdminRecord, error) {
	q := strings.Replace(s.sql.get, "\nFROM ", ", "+us("completed_at")+"\nFROM ", 1)
	var (
		ar        storekit.AdminRecord
		claimed   bool
		now       int64
		completed sql.NullInt64
	)
	r, err := scanRecord(s.db.QueryRowContext(ctx, s.causal(q), scope, key), &claimed, &now, &completed)
	if errors.Is(err, sql.ErrNoRows) {
		return ar, fmt.Errorf("mysqlstore: inspect: %w", storekit.ErrNotFound)
	}
	if err != nil {
		return ar, wrap(ctx, "inspect", err)
	}
	r.Scope, r.Key = scope, key
	ar.Record, ar.Now, ar.CompletedAt = r, fromMicros(now), sqlkit.NullTime(completed)
	return ar, nil
}

// Stuck implements storekit.Admin: processing records whose lease lapsed, the
// longest lapsed first, without responses. One SELECT (a table scan).
func (s *Store) Stuck(ctx context.Context, limit int) ([]storekit.AdminRecord, error) {
	if limit < 1 {
		return nil, fmt.Errorf("mysqlstore: stuck: limit %d must be positive", limit)
	}
	now := s.cfg.clock()
	q := "SELECT method, route, fingerprint, status, token, " +
		us("locked_until") + ", " + us("created_at") + ", " + us("expires_at") + ",\n" +
		"       NULL, NULL, NULL, FALSE, FALSE, " + us(now) + ", scope, `key`\n" +
		"FROM " + s.names.table + "\nWHERE status = 'processing' AND locked_until <= " + now + "\n" +
		"ORDER BY locked_until, scope, `key`\nLIMIT ?"
	rows, err := s.db.QueryContext(ctx, s.causal(q), limit)
	if err != nil {
		return nil, wrap(ctx, "stuck", err)
	}
	defer rows.Close()
	var claimed bool // the FALSE in claimed's place
	out, err := sqlkit.ScanStuck(rows, &claimed)
	if err != nil {
		return nil, wrap(ctx, "stuck", err)
	}
	return out, nil
}

// Release implements storekit.Admin: a fenced UPDATE to failed. When nothing
// matched, one more read tells why: not found, lease live, or lost.
func (s *Store) Release(ctx context.Context, f storekit.Fence, live bool) error {
	q := "UPDATE " + s.names.table + " SET status = 'failed'\nWHERE scope = ? AND `key` = ? AND token = ? AND status = 'processing'"
	if !live {
		q += " AND locked_until <= " + s.cfg.clock()
	}
	var n int64
	err := s.withRetry(ctx, func() error {
		res, err := s.db.ExecContext(ctx, q, f.Scope, f.Key, f.Token)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return wrap(ctx, "release", err)
	}
	if n > 0 {
		return nil
	}
	r, err := s.Inspect(ctx, f.Scope, f.Key)
	return fmt.Errorf("mysqlstore: release: %w", storekit.ReleaseRefused(r, err, f, live))
}

// Stats implements storekit.Admin. The clock, then one aggregate SELECT (a
// table scan) against it.
func (s *Store) Stats(ctx context.Context) (storekit.Stats, error) {
	now, err := s.now(ctx)
	if err != nil {
		return storekit.Stats{}, wrap(ctx, "stats", err)
	}
	// n: the clock just read, rebuilt from µs without any time zone.
	q := "SELECT status, COUNT(*),\n" +
		"  SUM(created_at > v.n - INTERVAL 1 MINUTE),\n" +
		"  SUM(created_at <= v.n - INTERVAL 1 MINUTE AND created_at > v.n - INTERVAL 1 HOUR),\n" +
		"  SUM(created_at <= v.n - INTERVAL 1 HOUR AND created_at > v.n - INTERVAL 1 DAY),\n" +
		"  SUM(created_at <= v.n - INTERVAL 1 DAY),\n" +
		"  SUM(expires_at <= v.n),\n" +
		"  SUM(status = 'processing' AND locked_until <= v.n),\n" +
		"  " + us("MIN(created_at)") + "\n" +
		"FROM " + s.names.table + "\n" +
		"CROSS JOIN (SELECT '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND AS n) v\n" +
		"GROUP BY status ORDER BY status"
	rows, err := s.db.QueryContext(ctx, s.causal(q), now.UnixMicro())
	if err != nil {
		return storekit.Stats{}, wrap(ctx, "stats", err)
	}
	defer rows.Close()
	st := storekit.Stats{Now: now}
	for rows.Next() {
		var (
			c      storekit.StatusCount
			status string
			oldest sql.NullInt64
		)
		if err := rows.Scan(&status, &c.Count, &c.UnderMinute, &c.UnderHour, &c.UnderDay, &c.Older,
			&c.Expired, &c.Stuck, &oldest); err != nil {
			return storekit.Stats{}, wrap(ctx, "stats", err)
		}
		c.Status, c.Oldest = storekit.Status(status), sqlkit.NullTime(oldest)
		st.ByStatus = append(st.ByStatus, c)
	}
	if err := rows.Err(); err != nil {
		return storekit.Stats{}, wrap(ctx, "stats", err)
	}
	return st, nil
}
