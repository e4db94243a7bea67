package sqlitestore

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

var _ storekit.StepStore = (*Store)(nil)

// LoadSteps implements storekit.StepStore: one fenced SELECT joining the record
// to its steps of the same incarnation. No row: the fence does not match.
func (s *Store) LoadSteps(ctx context.Context, f storekit.Fence) (map[string][]byte, error) {
	const op = "load steps"
	if err := ctx.Err(); err != nil {
		return nil, wrap(ctx, op, err)
	}
	st, err := s.stmt(ctx, s.sql.loadSteps)
	if err != nil {
		return nil, wrap(ctx, op, err)
	}
	rows, err := st.QueryContext(ctx, b(f.Scope), b(f.Key), f.Token)
	if err != nil {
		return nil, wrap(ctx, op, err)
	}
	defer rows.Close()
	out, found := map[string][]byte{}, false
	for rows.Next() {
		found = true
		var name, result []byte
		if err := rows.Scan(&name, &result); err != nil {
			return nil, wrap(ctx, op, err)
		}
		if name != nil { // the LEFT JOIN's row for a record without steps
			out[string(name)] = result
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, op, err)
	}
	if !found {
		return nil, fmt.Errorf("sqlitestore: load steps: %w", core.ErrLeaseLost)
	}
	return out, nil
}

// SaveStep implements storekit.StepStore: one fenced INSERT ... SELECT,
// committed on its own (autocommit). While the lease's transaction (Tx) is
// open it returns ErrStepInTx instead: that transaction holds the write
// lock, and waiting for it would wait for this very execution.
func (s *Store) SaveStep(ctx context.Context, f storekit.Fence, name string, result []byte) error {
	const op = "save step"
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	if name == "" || len(name) > storekit.MaxStepNameBytes {
		return fmt.Errorf("sqlitestore: save step: name must be 1 to %d bytes", storekit.MaxStepNameBytes)
	}
	if len(result) > core.MaxStepBytes {
		return fmt.Errorf("sqlitestore: save step: %w", core.ErrStepTooLarge)
	}
	if st := s.openTx(f); st != nil && st.MarkedTxOpen() {
		return ErrStepInTx
	}
	if result == nil {
		result = []byte{}
	}
	ok, err := s.fenced(ctx, s.sql.saveStep, b(name), result, b(f.Scope), b(f.Key), f.Token)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !ok {
		return fmt.Errorf("sqlitestore: save step: %w", core.ErrLeaseLost)
	}
	return nil
}
