package storetest

import (
	"context"

	"github.com/idemkit/idem/core/internal/leasehook"
	"github.com/idemkit/idem/core/storekit"
)

// NewLease builds a lease owning f, granted by s, for tests of stores that
// attach resources to the handler's lease (pgstore.Tx, mysqlstore.Tx). It
// names no record: core.RelayKey derives from (scope, key) and an empty
// incarnation. The engine builds its own leases (core.Decision.Context).
func NewLease(s storekit.Store, f storekit.Fence) storekit.Lease {
	return leasehook.New(s, f)
}

// ContextWithLease returns ctx carrying l, as a handler's context carries
// the lease of its request (storekit.LeaseFromContext finds it).
func ContextWithLease(ctx context.Context, l storekit.Lease) context.Context {
	return context.WithValue(ctx, storekit.LeaseContextKey, l)
}
