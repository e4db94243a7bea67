package sqlitestore

import (
	"context"
	"fmt"
)

const (
	// maxSweepBatch bounds one Sweep statement: it holds the write lock
	// (every other writer waits) until it commits.
	maxSweepBatch = 100_000
	// maintainBatch is the batch size Maintain sweeps with.
	maintainBatch = 1000
)

// Sweep deletes up to batch records that are past expires_at by more than
// the retention margin and not held by a live lease, oldest first (their
// steps go with them, by trigger), and returns how many it deleted. It also
// deletes up to batch commit marks of Tx older than a day that no record
// still processing under their token (within retention) needs: its
// takeover reads the mark (see sql.go, sweepMarks). Each is one
// autocommit statement. Call it in a loop until it returns fewer than batch
// (Maintain does).
func (s *Store) Sweep(ctx context.Context, batch int) (int, error) {
	if batch < 1 || batch > maxSweepBatch {
		return 0, fmt.Errorf("sqlitestore: sweep: batch %d out of range [1, %d]", batch, maxSweepBatch)
	}
	if err := ctx.Err(); err != nil {
		return 0, wrap(ctx, "sweep", err)
	}
	if err := s.wr.lock(ctx); err != nil {
		return 0, wrap(ctx, "sweep", err)
	}
	defer s.wr.unlock()
	res, err := s.db.ExecContext(ctx, s.sql.sweep, micros(s.cfg.Margin), batch)
	if err != nil {
		return 0, wrap(ctx, "sweep", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, wrap(ctx, "sweep", err)
	}
	if _, err := s.db.ExecContext(ctx, s.sql.sweepMarks, micros(markTTL), batch); err != nil {
		return int(n), wrap(ctx, "sweep commit marks", err)
	}
	return int(n), nil
}

// Maintain runs the retention work: Sweep in batches of 1000 until no
// expired record is left. Run it periodically; concurrent runs, from any
// process, are safe.
func (s *Store) Maintain(ctx context.Context) error {
	for {
		n, err := s.Sweep(ctx, maintainBatch)
		if err != nil {
			return fmt.Errorf("sqlitestore: maintain: %w", err)
		}
		if n < maintainBatch {
			return nil
		}
	}
}
