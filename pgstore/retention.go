package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// maxSweepBatch bounds one Sweep statement: the rows it deletes stay
	// locked until it commits, and its WAL is written in one go.
	maxSweepBatch = 100_000
	// maintainBatch is the batch size Maintain sweeps with.
	maintainBatch = 1000
	// ddlLockTimeout bounds how long partition DDL waits for its locks.
	// DROP and ATTACH need strong locks on the payload table; waiting
	// behind a long query would queue every claim behind the DDL, so the
	// DDL gives up instead and the next Maintain run tries again.
	ddlLockTimeout = "5s"
)

// Sweep deletes up to batch records that are past expires_at by more than
// the retention margin and not held by a live lease, oldest first, in one
// statement, and returns how many it deleted. Rows locked by a concurrent
// claim are skipped (FOR UPDATE SKIP LOCKED), so Sweep never waits on, nor
// delays, live traffic for long. Call it in a loop until it returns fewer
// than batch (Maintain does).
//
// In partitioned mode Sweep deletes rows of the claim table only; their
// payloads go when Maintain drops their partition.
func (s *Store) Sweep(ctx context.Context, batch int) (int, error) {
	if batch < 1 || batch > maxSweepBatch {
		return 0, fmt.Errorf("pgstore: sweep: batch %d out of range [1, %d]", batch, maxSweepBatch)
	}
	if err := ctx.Err(); err != nil {
		return 0, wrap(ctx, "sweep", err)
	}
	tag, err := s.pool.Exec(ctx, s.sql.sweep, micros(s.cfg.margin), batch)
	if err != nil {
		return 0, wrap(ctx, "sweep", err)
	}
	return int(tag.RowsAffected()), nil
}

// Maintain runs the retention work of the store's mode. Run it periodically
// (every few minutes to every hour) from one or more instances; concurrent
// runs are safe.
//
// Plain mode: Sweep in batches of 1000 until no expired record is left.
//
// Partitioned mode, each step in its own short transaction:
//  1. create the payload partitions for today and the configured days ahead
//     (UTC days, database clock), moving into each any rows the default
//     partition caught for its day;
//  2. drop every payload partition whose day ended more than the retention
//     margin ago and which holds no payload expiring later than now minus the
//     margin (one index probe each); a partition still needed by a
//     long-retention record is kept;
//  3. delete expired rows from the default partition;
//  4. sweep the claim table in batches of 1000.
//
// Maintain goes on after a failed step and returns all errors joined.
func (s *Store) Maintain(ctx context.Context) error {
	var errs []error
	if s.cfg.partitioned {
		now, err := s.now(ctx)
		if err != nil {
			return wrap(ctx, "maintain", err)
		}
		for d := 0; d <= s.cfg.daysAhead; d++ {
			if err := s.EnsurePartition(ctx, now.AddDate(0, 0, d)); err != nil {
				errs = append(errs, err)
			}
		}
		if err := s.dropExpiredPartitions(ctx, now); err != nil {
			errs = append(errs, err)
		}
		if _, err := s.pool.Exec(ctx, `DELETE FROM `+s.names.payloadDef+` WHERE expires_at <= $1`,
			now.Add(-s.cfg.margin)); err != nil {
			errs = append(errs, wrap(ctx, "maintain: clean default partition", err))
		}
	}
	for {
		n, err := s.Sweep(ctx, maintainBatch)
		if err != nil {
			errs = append(errs, fmt.Errorf("pgstore: maintain: %w", err))
			break
		}
		if n < maintainBatch {
			break
		}
	}
	return errors.Join(errs...)
}

func (s *Store) now(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := s.pool.QueryRow(ctx, s.sql.now).Scan(&now)
	return now, err
}

func utcDay(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

func pgTimeLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05") + "+00'"
}

// EnsurePartition creates the payload partition for the UTC day containing
// t, if missing (partitioned mode only). Maintain and Migrate call it for
// today and the days ahead; it is exported for operators who want to
// pre-create further days and for tests that need the partition of an
// explicit instant. Safe to call concurrently.
func (s *Store) EnsurePartition(ctx context.Context, t time.Time) error {
	if !s.cfg.partitioned {
		return errors.New("pgstore: ensure partition: store is not in partitioned mode")
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
			return err
		}
		return ensurePartition(ctx, tx, s.cfg, t)
	})
	if err != nil {
		return wrap(ctx, "ensure partition "+s.cfg.partitionName(t), err)
	}
	return nil
}

// ensurePartition creates and attaches the partition for t's UTC day inside
// tx, which must hold the advisory lock. The partition is created detached,
// filled with any rows the default partition holds for its day, then
// attached: ATTACH PARTITION takes a weaker lock on the parent than CREATE
// TABLE ... PARTITION OF, and a plain CREATE would fail if the default
// partition held rows of that day.
func ensurePartition(ctx context.Context, tx pgx.Tx, cfg config, t time.Time) error {
	n := cfg.names()
	lo := utcDay(t)
	hi := lo.AddDate(0, 0, 1)
	name := cfg.partitionName(lo)
	qname := pgx.Identifier{cfg.schema, name}.Sanitize()
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists); err != nil {
		return fmt.Errorf("partition %s: %w", name, err)
	}
	if exists {
		return nil
	}
	steps := []struct {
		what string
		sql  string
		args []any
	}{
		{"lock timeout", "SET LOCAL lock_timeout = '" + ddlLockTimeout + "'", nil},
		{"create", "CREATE TABLE " + qname + " (LIKE " + n.payload + " INCLUDING DEFAULTS INCLUDING CONSTRAINTS)", nil},
		{"move rows from default partition", "WITH m AS (DELETE FROM " + n.payloadDef +
			" WHERE stored_at >= $1 AND stored_at < $2 RETURNING *) INSERT INTO " + qname + " SELECT * FROM m",
			[]any{lo, hi}},
		{"attach", "ALTER TABLE " + n.payload + " ATTACH PARTITION " + qname +
			" FOR VALUES FROM (" + pgTimeLiteral(lo) + ") TO (" + pgTimeLiteral(hi) + ")", nil},
	}
	for _, st := range steps {
		if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
			return fmt.Errorf("partition %s: %s: %w", name, st.what, err)
		}
	}
	return nil
}

// Partitions returns the UTC days for which a payload partition exists,
// oldest first (partitioned mode only).
func (s *Store) Partitions(ctx context.Context) ([]time.Time, error) {
	if !s.cfg.partitioned {
		return nil, errors.New("pgstore: partitions: store is not in partitioned mode")
	}
	days, _, err := s.partitions(ctx)
	if err != nil {
		return nil, wrap(ctx, "partitions", err)
	}
	return days, nil
}

func (s *Store) partitions(ctx context.Context) ([]time.Time, map[time.Time]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, s.names.payload)
	if err != nil {
		return nil, nil, err
	}
	rels, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, err
	}
	prefix := s.cfg.table + "_p"
	byDay := map[time.Time]string{}
	var days []time.Time
	for _, rel := range rels {
		suffix, ok := strings.CutPrefix(rel, prefix)
		if !ok || len(suffix) != 8 {
			continue // the default partition, or not ours
		}
		day, err := time.Parse("20060102", suffix)
		if err != nil {
			continue
		}
		byDay[day] = rel
		days = append(days, day)
	}
	sort.Slice(days, func(i, j int) bool { return days[i].Before(days[j]) })
	return days, byDay, nil
}

func (s *Store) dropExpiredPartitions(ctx context.Context, now time.Time) error {
	days, byDay, err := s.partitions(ctx)
	if err != nil {
		return wrap(ctx, "maintain: list partitions", err)
	}
	cutoff := now.Add(-s.cfg.margin)
	var errs []error
	for _, day := range days {
		if day.AddDate(0, 0, 1).After(cutoff) {
			break // sorted: every later day is newer still
		}
		qname := pgx.Identifier{s.cfg.schema, byDay[day]}.Sanitize()
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+ddlLockTimeout+"'"); err != nil {
				return err
			}
			var live bool
			if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+qname+" WHERE expires_at > $1)", cutoff).Scan(&live); err != nil {
				return err
			}
			if live {
				return nil
			}
			_, err := tx.Exec(ctx, "DROP TABLE "+qname)
			return err
		})
		if err != nil {
			errs = append(errs, wrap(ctx, "maintain: drop partition "+byDay[day], err))
		}
	}
	return errors.Join(errs...)
}
