package core

import "github.com/idemkit/idem/core/storekit"

// Store is where idempotency records live: pass one to New (core/memstore
// in one process; pgstore or mysqlstore across a fleet). Store authors
// implement it from core/storekit, which documents its contract; this is
// the same type.
type Store = storekit.Store
