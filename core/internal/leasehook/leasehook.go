// Package leasehook lets core/storetest build a lease for store tests
// without core exporting a constructor service authors would see: core
// sets New when it is initialised.
package leasehook

import "github.com/idemkit/idem/core/storekit"

// New builds the engine's lease owning f, granted by s.
var New func(s storekit.Store, f storekit.Fence) storekit.Lease
