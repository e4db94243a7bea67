package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core/storekit"
)

// The operator's statements (storekit.Admin, used by cmd/idemctl). They are off
// the hot path: Stuck and Stats scan the claim table (no index serves them;
// on a large table run them on a replica or rarely), the others touch one
// row by primary key. Every instant is the database's, as in sql.go.

var _ storekit.Admin = (*Store)(nil)

// nowExpr is the store's clock expression (now(), shifted in tests).
func (s *Store) nowExpr() string { return strings.TrimPrefix(s.sql.now, "SELECT ") }

// Inspect implements storekit.Admin: the record with its response, when it
// completed, and whether a duplicate waits on it. One SELECT.
func (s *Store) Inspect(ctx context.Context, scope, key string) (storekit.AdminRecord, error) {
	// The Get statement plus two claim-table columns (neither name exists in
	// the payload table, so they are unambiguous in partitioned mode).
	q := strings.Replace(s.sql.get, "\nFROM ", ", completed_at, waiters\nFROM ", 1)
	var (
		ar          storekit.AdminRecord
		hasPayload  bool
		completedAt *time.Time
	)
	r, err := scanRecord(s.pool.QueryRow(ctx, q, scope, key), &hasPayload, &ar.Now, &completedAt, &ar.Waiters)
	if errors.Is(err, pgx.ErrNoRows) {
		return ar, fmt.Errorf("pgstore: inspect: %w", storekit.ErrNotFound)
	}
	if err != nil {
		return ar, wrap(ctx, "inspect", err)
	}
	ar.Record = r
	if completedAt != nil {
		ar.CompletedAt = *completedAt
	}
	return ar, nil
}

// Stuck implements storekit.Admin: processing records whose lease lapsed, the
// longest lapsed first. One SELECT (a scan of the claim table).
func (s *Store) Stuck(ctx context.Context, limit int) ([]storekit.AdminRecord, error) {
	if limit < 1 {
		return nil, fmt.Errorf("pgstore: stuck: limit %d must be positive", limit)
	}
	now := s.nowExpr()
	q := `SELECT ` + recordCols + `, NULL::integer, NULL::jsonb, NULL::bytea, false, false, ` + now + `, completed_at, waiters
FROM ` + s.names.table + `
WHERE status = 'processing' AND locked_until <= ` + now + `
ORDER BY locked_until, scope, key
LIMIT $1`
	rows, err := s.pool.Query(ctx, q, limit)
	if err != nil {
		return nil, wrap(ctx, "stuck", err)
	}
	defer rows.Close()
	var out []storekit.AdminRecord
	for rows.Next() {
		var (
			ar          storekit.AdminRecord
			hasPayload  bool
			completedAt *time.Time
		)
		r, err := scanRecord(rows, &hasPayload, &ar.Now, &completedAt, &ar.Waiters)
		if err != nil {
			return nil, wrap(ctx, "stuck", err)
		}
		ar.Record = r
		if completedAt != nil {
			ar.CompletedAt = *completedAt
		}
		out = append(out, ar)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, "stuck", err)
	}
	return out, nil
}

// Release implements storekit.Admin: a fenced UPDATE to failed (plus the
// wake-up of waiting duplicates, as Fail does). When nothing matched, one
// more read tells why: not found, lease live, or lost.
func (s *Store) Release(ctx context.Context, f storekit.Fence, live bool) error {
	now := s.nowExpr()
	q := `UPDATE ` + s.names.table + ` SET status = 'failed'
WHERE scope = $1 AND key = $2 AND token = $3 AND status = 'processing'`
	if !live {
		q += ` AND locked_until <= ` + now
	}
	q += ` RETURNING waiters`
	matched, waiters, err := fenced(ctx, s.pool, q, f.Scope, f.Key, f.Token)
	if err != nil {
		return wrap(ctx, "release", err)
	}
	if matched {
		if waiters {
			s.notify(ctx, f.Scope, f.Key)
		}
		return nil
	}
	r, err := s.Inspect(ctx, f.Scope, f.Key)
	return fmt.Errorf("pgstore: release: %w", storekit.ReleaseRefused(r, err, f, live))
}

// Stats implements storekit.Admin. One aggregate SELECT over the claim table.
func (s *Store) Stats(ctx context.Context) (storekit.Stats, error) {
	now, err := s.now(ctx)
	if err != nil {
		return storekit.Stats{}, wrap(ctx, "stats", err)
	}
	q := `SELECT status, count(*),
  count(*) FILTER (WHERE created_at > $1::timestamptz - interval '1 minute'),
  count(*) FILTER (WHERE created_at <= $1::timestamptz - interval '1 minute' AND created_at > $1::timestamptz - interval '1 hour'),
  count(*) FILTER (WHERE created_at <= $1::timestamptz - interval '1 hour' AND created_at > $1::timestamptz - interval '1 day'),
  count(*) FILTER (WHERE created_at <= $1::timestamptz - interval '1 day'),
  count(*) FILTER (WHERE expires_at <= $1::timestamptz),
  count(*) FILTER (WHERE status = 'processing' AND locked_until <= $1::timestamptz),
  min(created_at)
FROM ` + s.names.table + `
GROUP BY status ORDER BY status`
	rows, err := s.pool.Query(ctx, q, now)
	if err != nil {
		return storekit.Stats{}, wrap(ctx, "stats", err)
	}
	defer rows.Close()
	st := storekit.Stats{Now: now}
	for rows.Next() {
		var (
			c      storekit.StatusCount
			status string
		)
		if err := rows.Scan(&status, &c.Count, &c.UnderMinute, &c.UnderHour, &c.UnderDay, &c.Older,
			&c.Expired, &c.Stuck, &c.Oldest); err != nil {
			return storekit.Stats{}, wrap(ctx, "stats", err)
		}
		c.Status = storekit.Status(status)
		st.ByStatus = append(st.ByStatus, c)
	}
	if err := rows.Err(); err != nil {
		return storekit.Stats{}, wrap(ctx, "stats", err)
	}
	return st, nil
}

// MigratedMode reports how the store that opts name (schema and table) was
// migrated: partitioned or plain. Tools that open a store they did not
// create (cmd/idemctl) use it to pick the matching options; a store opened
// in the wrong mode reads the wrong tables. ErrNotFound when the table was
// never migrated.
func MigratedMode(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (partitioned bool, err error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return false, err
	}
	var mode string
	err = pool.QueryRow(ctx, `SELECT mode FROM `+cfg.names().migrations+` WHERE table_name = $1 ORDER BY version DESC LIMIT 1`,
		cfg.table).Scan(&mode)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("pgstore: table %s.%s was never migrated: %w", cfg.schema, cfg.table, storekit.ErrNotFound)
	}
	if err != nil {
		return false, wrap(ctx, "migrated mode", err)
	}
	return mode == "partitioned", nil
}
