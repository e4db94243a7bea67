package routers

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/internal/pgstoretest"
)

// postgresStore is pgstore in a fresh schema (fails, never skips, when
// PostgreSQL is unreachable).
func postgresStore(t *testing.T) core.Store {
	store, _ := pgstoretest.Store(t)
	return store
}
