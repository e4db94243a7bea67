// Package batchtest pins pgstore's batching for tests that need concurrent
// requests to share statements under any load (the model check's batched
// variants). In production the in-flight limit adapts (pgstore.WithoutBatching).
package batchtest

import (
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/internal/hook"
)

// WithLimit pins the statements of each kind in flight at n (n = 1: every
// request that arrives while one is in flight queues for the next).
func WithLimit(n int) pgstore.Option {
	return hook.BatchLimit(n).(pgstore.Option)
}
