package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

var _ storekit.StepStore = (*Store)(nil)

// LoadSteps implements storekit.StepStore: one fenced SELECT of the record's
// steps document (migration 0004).
func (s *Store) LoadSteps(ctx context.Context, f storekit.Fence) (map[string][]byte, error) {
	const op = "load steps"
	if err := ctx.Err(); err != nil {
		return nil, wrap(ctx, op, err)
	}
	st, err := s.stmt(ctx, s.sql.loadSteps)
	if err != nil {
		return nil, wrap(ctx, op, err)
	}
	var (
		doc  []byte
		born int64
	)
	err = s.withRetry(ctx, func() error {
		return st.QueryRowContext(ctx, f.Scope, f.Key, f.Token).Scan(&doc, &born)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("mysqlstore: load steps: %w", core.ErrLeaseLost)
	}
	if err != nil {
		return nil, wrap(ctx, op, err)
	}
	steps, err := parseSteps(doc, born)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: load steps: %w", err)
	}
	return steps, nil
}

// parseSteps decodes a steps document; one born for another incarnation
// of the record (or none) holds no steps of this one.
func parseSteps(doc []byte, born int64) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(doc) == 0 {
		return out, nil
	}
	var m map[string]string
	if err := json.Unmarshal(doc, &m); err != nil {
		return nil, fmt.Errorf("decode steps: %w", err)
	}
	if m["born"] != strconv.FormatInt(born, 10) {
		return out, nil
	}
	for k, v := range m {
		hexName, ok := strings.CutPrefix(k, "h")
		if !ok {
			continue
		}
		name, err := hex.DecodeString(hexName)
		if err != nil {
			return nil, fmt.Errorf("decode step name: %w", err)
		}
		res, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("decode step result: %w", err)
		}
		out[string(name)] = res
	}
	return out, nil
}

// SaveStep implements storekit.StepStore: one fenced UPDATE of the record's
// row, durable on its own (autocommit, never the handler's transaction).
// An UPDATE that changed nothing (the same result saved again) is told
// from a lost lease by a second, fenced read.
func (s *Store) SaveStep(ctx context.Context, f storekit.Fence, name string, result []byte) error {
	const op = "save step"
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	if name == "" || len(name) > storekit.MaxStepNameBytes {
		return fmt.Errorf("mysqlstore: save step: name must be 1 to %d bytes", storekit.MaxStepNameBytes)
	}
	if len(result) > core.MaxStepBytes {
		return fmt.Errorf("mysqlstore: save step: %w", core.ErrStepTooLarge)
	}
	path := "$.h" + hex.EncodeToString([]byte(name))
	val := base64.StdEncoding.EncodeToString(result)
	ok, err := s.fenced(ctx, s.sql.saveStep, path, val, f.Scope, f.Key, f.Token)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if ok {
		return nil
	}
	// Nothing changed: a lost lease, or this exact result was already
	// there (without CLIENT_FOUND_ROWS only changed rows count).
	if _, err := s.LoadSteps(ctx, f); err != nil {
		return err
	}
	return nil
}
