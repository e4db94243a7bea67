// Package leasehook lets core/storetest build a lease for store tests
// without core exporting a constructor service authors would see: core
// sets these functions when it is initialised.
package leasehook

import (
	"context"

	"github.com/idemkit/idem/core/storekit"
)

var (
	// New builds a *core.Lease owning f, granted by s.
	New func(s storekit.Store, f storekit.Fence) any
	// WithLease returns ctx carrying l, a *core.Lease.
	WithLease func(ctx context.Context, l any) context.Context
)
