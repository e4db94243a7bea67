package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

const (
	// maxSweepBatch bounds one Sweep statement: the rows it deletes stay
	// locked until it commits, and on Galera its write set is replicated in
	// one piece (wsrep_max_ws_rows, wsrep_max_ws_size).
	maxSweepBatch = 100_000
	// maintainBatch is the batch size Maintain sweeps with.
	maintainBatch = 1000
)

// Sweep deletes up to batch records that are past expires_at by more than
// the retention margin and not held by a live lease, oldest first, and
// returns how many it deleted. It also deletes up to batch old rows of the
// token table (every draw but the newest; the AUTO_INCREMENT counter does
// not depend on them) and up to batch commit marks of Tx older than a day
// (left by handlers that committed themselves and died before Complete). Call it in a loop until it returns fewer than batch
// (Maintain does).
//
// Each batch is its own short READ COMMITTED transaction: at REPEATABLE
// READ, the server's default, the DELETE's range scan on expires_at would
// take next-key locks up to the newest record and make concurrent claims'
// inserts wait behind it.
func (s *Store) Sweep(ctx context.Context, batch int) (int, error) {
	if batch < 1 || batch > maxSweepBatch {
		return 0, fmt.Errorf("mysqlstore: sweep: batch %d out of range [1, %d]", batch, maxSweepBatch)
	}
	if err := ctx.Err(); err != nil {
		return 0, wrap(ctx, "sweep", err)
	}
	var n int64
	err := s.withRetry(ctx, func() error {
		var err error
		n, err = s.inReadCommitted(ctx, s.sql.sweep, micros(s.cfg.Margin), batch)
		return err
	})
	if err != nil {
		return 0, wrap(ctx, "sweep", err)
	}
	if err := s.withRetry(ctx, func() error {
		_, err := s.inReadCommitted(ctx, s.sql.sweepToks, batch)
		return err
	}); err != nil {
		return int(n), wrap(ctx, "sweep tokens", err)
	}
	if err := s.withRetry(ctx, func() error {
		_, err := s.inReadCommitted(ctx, s.sql.sweepMarks, micros(markTTL), batch)
		return err
	}); err != nil {
		return int(n), wrap(ctx, "sweep commit marks", err)
	}
	return int(n), nil
}

func (s *Store) inReadCommitted(ctx context.Context, query string, args ...any) (int64, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// Maintain runs the retention work: Sweep in batches of 1000 until no
// expired record is left. Run it periodically (every few minutes to every
// hour) from one or more instances; concurrent runs are safe.
func (s *Store) Maintain(ctx context.Context) error {
	for {
		n, err := s.Sweep(ctx, maintainBatch)
		if err != nil {
			return fmt.Errorf("mysqlstore: maintain: %w", err)
		}
		if n < maintainBatch {
			return nil
		}
	}
}

// now reads the database clock (tests, tools).
func (s *Store) now(ctx context.Context) (time.Time, error) {
	var v int64
	if err := s.db.QueryRowContext(ctx, s.sql.now).Scan(&v); err != nil {
		return time.Time{}, err
	}
	return fromMicros(v), nil
}
