package storekit

import "context"

// Lease is one execution the engine granted: the claim's fence, the store
// that granted it, and values a store attaches for the execution's life
// (pgstore's business transaction, the statements Defer queues), which the
// store finishes in Complete or Fail. The handler's context carries it.
type Lease interface {
	// Fence returns the (scope, key, token) the lease owns.
	Fence() Fence
	// Store returns the store that granted the lease.
	Store() Store
	// Value returns the value attached under k, if any.
	Value(k any) (any, bool)
	// Attach returns the value attached under k, creating it with create
	// when absent. create runs under the lease's lock, at most once per
	// successful attachment; on an error nothing is attached.
	Attach(k any, create func() (any, error)) (any, error)
	// Detach removes and returns the value attached under k.
	Detach(k any) (any, bool)
}

type leaseKey struct{}

// LeaseContextKey is the context key of the Lease a handler's context
// carries: the engine answers it from contexts of its own, and a nil value
// under it hides an outer lease.
var LeaseContextKey any = leaseKey{}

// LeaseFromContext returns the lease ctx carries: ctx belongs to a handler
// (or a Commit, Fail or step) of an execution the engine granted.
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(LeaseContextKey).(Lease)
	return l, ok
}
