package core

import "github.com/idemkit/idem/core/storekit"

// Store is where idempotency records live: pass one to New (core/memstore
// in one process; pgstore or mysqlstore across a fleet). Store authors
// implement it from core/storekit, which documents its contract; this is
// the same type.
type Store = storekit.Store

// ErrLeaseLost means the lease of the handler's request no longer owns its
// record: another owner took the key over (the handler's context is then
// cancelled with it as the cause), and nothing was changed. It is the same
// error as storekit.ErrLeaseLost; test with errors.Is.
var ErrLeaseLost = storekit.ErrLeaseLost
