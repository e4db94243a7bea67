package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// Recovery points: pgstore implements storekit.StepStore with the steps table
// of migration 0005. Each statement is single-row by (scope, key) like the
// rest of the store, and runs on the store's pool in its own (autocommit)
// transaction, never in the handler's business transaction (Tx): a step
// records an effect outside that transaction, and must stay recorded when
// the business transaction rolls back.

var _ storekit.StepStore = (*Store)(nil)

// stepStatements are the SQL texts of the step methods.
type stepStatements struct {
	save string
	load string
}

// stepsTable is the quoted steps table of c.
func stepsTable(c config) string {
	return pgx.Identifier{c.schema, c.table + "_steps"}.Sanitize()
}

func buildStepStatements(c config) stepStatements {
	n := c.names()
	// The owned record, as fenced writes find it (fenceWhere: $1 scope,
	// $2 key, $3 token).
	owned := `SELECT scope, key, token, created_at FROM ` + n.table + ` WHERE ` + fenceWhere
	var st stepStatements
	// FOR SHARE makes the write and a takeover of the record serialise:
	// a concurrent claim's update either commits first (READ COMMITTED
	// re-checks the fence on the new row version, which no longer matches:
	// nothing is written) or waits for this statement, and then the new
	// owner reads the step. The CASE keeps a step synchronous even where
	// the session runs with synchronous_commit = off (set_config(...,
	// true) lasts until this statement's commit): the step must be durable
	// when SaveStep returns. PostgreSQL-only (set_config, current_setting).
	// $4 name, $5 result.
	st.save = `INSERT INTO ` + stepsTable(c) + ` (scope, key, name, epoch, token, result, stored_at)
SELECT r.scope, r.key, $4::text, r.created_at, r.token, $5::bytea, {{NOW}}
FROM (` + owned + ` FOR SHARE) r
WHERE CASE WHEN current_setting('synchronous_commit') = 'off'
           THEN set_config('synchronous_commit', 'on', true) IS NOT NULL
           ELSE true END
ON CONFLICT (scope, key, name) DO UPDATE
SET epoch = excluded.epoch, token = excluded.token, result = excluded.result, stored_at = excluded.stored_at`
	// One row per step of the record's current incarnation, or one row of
	// NULLs when it has none; no row when the fence does not match.
	st.load = `SELECT s.name, s.result
FROM (` + owned + `) r
LEFT JOIN ` + stepsTable(c) + ` s ON s.scope = r.scope AND s.key = r.key AND s.epoch = r.created_at`
	r := nowReplacer(c)
	st.save, st.load = r.Replace(st.save), r.Replace(st.load)
	return st
}

// SaveStep implements storekit.StepStore: one INSERT ... ON CONFLICT, fenced by
// the lease token, committed (synchronously) before it returns.
func (s *Store) SaveStep(ctx context.Context, f storekit.Fence, name string, result []byte) error {
	const op = "save step"
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	if result == nil {
		result = []byte{} // the column is NOT NULL; nil and empty read back alike
	}
	matched, err := s.saveStep(ctx, f, name, result)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !matched {
		return fmt.Errorf("pgstore: save step: %w", core.ErrLeaseLost)
	}
	return nil
}

// LoadSteps implements storekit.StepStore: one SELECT.
func (s *Store) LoadSteps(ctx context.Context, f storekit.Fence) (map[string][]byte, error) {
	const op = "load steps"
	if err := ctx.Err(); err != nil {
		return nil, wrap(ctx, op, err)
	}
	rows, err := s.pool.Query(ctx, s.steps.load, f.Scope, f.Key, f.Token)
	if err != nil {
		return nil, wrap(ctx, op, err)
	}
	out := map[string][]byte{}
	owned := false
	var (
		name   *string
		result []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &result}, func() error {
		owned = true
		if name != nil {
			out[*name] = append([]byte{}, result...) // result is pgx's buffer
		}
		return nil
	})
	if err != nil {
		return nil, wrap(ctx, op, err)
	}
	if !owned {
		return nil, fmt.Errorf("pgstore: load steps: %w", core.ErrLeaseLost)
	}
	return out, nil
}
