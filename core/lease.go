package core

import (
	"context"
	"sync"
)

// Lease is the ownership of one execution, carried by the handler's context
// (see Decision.Context). Stores use it to attach per-execution resources,
// such as pgstore's business transaction, that Commit or Abort later finish.
type Lease struct {
	fence Fence
	store Store

	mu   sync.Mutex
	vals map[any]any
}

// Fence returns the (scope, key, token) this lease owns.
func (l *Lease) Fence() Fence { return l.fence }

// Store returns the store that granted the lease.
func (l *Lease) Store() Store { return l.store }

// Value returns the value attached under k, if any.
func (l *Lease) Value(k any) (any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.vals[k]
	return v, ok
}

// Attach returns the value attached under k, creating it with create when
// absent. create runs under the lease's lock, at most once per successful
// attachment; an error is returned and nothing is attached.
func (l *Lease) Attach(k any, create func() (any, error)) (any, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.vals[k]; ok {
		return v, nil
	}
	v, err := create()
	if err != nil {
		return nil, err
	}
	if l.vals == nil {
		l.vals = make(map[any]any)
	}
	l.vals[k] = v
	return v, nil
}

// Detach removes and returns the value attached under k.
func (l *Lease) Detach(k any) (any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.vals[k]
	delete(l.vals, k)
	return v, ok
}

type leaseCtxKey struct{}

// LeaseFromContext returns the lease carried by ctx, if the context belongs
// to a handler that idem let proceed.
func LeaseFromContext(ctx context.Context) (*Lease, bool) {
	l, ok := ctx.Value(leaseCtxKey{}).(*Lease)
	return l, ok && l != nil
}

// ContextWithLease returns ctx carrying l. Adapters do not need it
// (Decision.Context does it); it exists for stores' and adapters' tests.
func ContextWithLease(ctx context.Context, l *Lease) context.Context {
	return context.WithValue(ctx, leaseCtxKey{}, l)
}

// NewLease builds a lease for tests of stores that attach resources to it.
// The engine builds its own.
func NewLease(s Store, f Fence) *Lease { return &Lease{fence: f, store: s} }

// KeyFromContext returns the idempotency key of the request the handler is
// serving, as the client sent it (decoded), and whether there is one.
func KeyFromContext(ctx context.Context) (string, bool) {
	l, ok := LeaseFromContext(ctx)
	if !ok {
		return "", false
	}
	return l.fence.Key, true
}

// RelayKey returns a key for one downstream call (label names it, e.g.
// "stripe-charge"), derived deterministically from (scope, key, label): a
// retry of the same request, even one run by another instance after a
// takeover, sends the provider the same key, so the provider deduplicates it.
// It returns "" when ctx carries no lease.
func RelayKey(ctx context.Context, label string) string {
	l, ok := LeaseFromContext(ctx)
	if !ok {
		return ""
	}
	return relayKey(l.fence.Scope, l.fence.Key, label)
}

func relayKey(scope, key, label string) string {
	x := newHasher()
	defer x.release()
	x.field("idem-relay-v1")
	x.field(scope)
	x.field(key)
	x.field(label)
	return x.hexSum("idem_", 20)
}
