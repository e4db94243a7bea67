package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
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
// (left by handlers that committed themselves and died before Complete)
// that no record still processing needs (see sweepMarks). Call it in a
// loop until it returns fewer than batch (Maintain does).
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
	if err := s.withRetry(ctx, func() error { return s.sweepMarks(ctx, batch) }); err != nil {
		return int(n), wrap(ctx, "sweep commit marks", err)
	}
	return int(n), nil
}

// sweepMarks deletes up to batch commit marks of Tx older than markTTL,
// except those a record still needs: a record processing under the mark's
// token within retention, whose handler committed and died before
// Complete. The claim that takes its lapsed lease over finds the mark and
// completes it as not retained; without the mark it would run the
// committed writes again, however long the retention (longer than markTTL
// is allowed). That record is found by a scan of the table (no index on
// token): one statement, run only when marks were left behind. A mark
// found not needed stays so: a record's token only moves forward. Needed
// marks are paged past (by token), so that they cannot hold the sweep back
// from the unneeded marks behind them.
func (s *Store) sweepMarks(ctx context.Context, batch int) error {
	for after := int64(0); ; {
		old, err := s.tokens(ctx, s.sql.oldMarks, micros(markTTL), after, batch)
		if err != nil || len(old) == 0 {
			return err
		}
		held, err := s.tokens(ctx, tokenList(s.sql.heldMarks, old))
		if err != nil {
			return err
		}
		after = old[len(old)-1]
		full := len(old) == batch
		drop := slices.DeleteFunc(old, func(tok int64) bool { return slices.Contains(held, tok) })
		if len(drop) > 0 {
			_, err = s.db.ExecContext(ctx, tokenList(s.sql.dropMarks, drop))
			return err
		}
		if !full {
			return nil
		}
	}
}

// tokens runs query and returns its single BIGINT column.
func (s *Store) tokens(ctx context.Context, query string, args ...any) ([]int64, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			return nil, err
		}
		out = append(out, tok)
	}
	return out, rows.Err()
}

// tokenList completes prefix with toks as integer literals and ")".
func tokenList(prefix string, toks []int64) string {
	b := []byte(prefix)
	for i, tok := range toks {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, tok, 10)
	}
	return string(append(b, ')'))
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
