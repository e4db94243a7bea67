package core

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem/core/internal/leasehook"
	"github.com/idemkit/idem/core/storekit"
)

// grant is the engine's storekit.Lease: the ownership of one execution,
// carried by the handler's context (see Decision.Context). Stores use it to
// attach per-execution resources, such as pgstore's business transaction,
// that Commit or Abort later finish.
type grant struct {
	fence storekit.Fence
	store Store
	// fresh: the claim created the record, so it has no steps (step.go).
	fresh bool
	// born and fp are the record's CreatedAt and fingerprint: its
	// incarnation, which relay keys derive from.
	born time.Time
	fp   string
	// kept: the request kept for a completer, saved with the first step
	// (step.go); nil when its route asks for none.
	kept []byte
	// synced: the claim was made durable before the first relay key left
	// (ClaimSyncer); lose cancels the handler's context when it could not be.
	synced sync.Once
	lose   func(error)

	mu   sync.Mutex
	vals map[any]any
}

// Fence returns the (scope, key, token) this lease owns.
func (l *grant) Fence() storekit.Fence { return l.fence }

// Store returns the store that granted the lease.
func (l *grant) Store() Store { return l.store }

// Value returns the value attached under k, if any.
func (l *grant) Value(k any) (any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.vals[k]
	return v, ok
}

// Attach returns the value attached under k, creating it with create when
// absent. create runs under the lease's lock, at most once per successful
// attachment; an error is returned and nothing is attached.
func (l *grant) Attach(k any, create func() (any, error)) (any, error) {
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
func (l *grant) Detach(k any) (any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.vals[k]
	delete(l.vals, k)
	return v, ok
}

// leaseFrom returns the engine's lease carried by ctx, if the context
// belongs to a handler that idem let proceed.
func leaseFrom(ctx context.Context) (*grant, bool) {
	if lc, ok := ctx.(*leaseCtx); ok { // the handler's own context: no walk up the chain
		return lc.lease, lc.lease != nil
	}
	l, ok := ctx.Value(storekit.LeaseContextKey).(*grant)
	return l, ok && l != nil
}

// Store tests build leases through core/storetest (NewLease,
// ContextWithLease); the engine builds its own.
func init() {
	leasehook.New = func(s storekit.Store, f storekit.Fence) storekit.Lease { return &grant{fence: f, store: s} }
}

// KeyFromContext returns the idempotency key of the request the handler is
// serving, as the client sent it (decoded), and whether there is one.
func KeyFromContext(ctx context.Context) (string, bool) {
	l, ok := leaseFrom(ctx)
	if !ok {
		return "", false
	}
	return l.fence.Key, true
}

// RelayKey returns a key for one downstream call (label names it, e.g.
// "stripe-charge"), derived deterministically from (scope, key, label) and
// the record's incarnation (when it was created, and its fingerprint): every
// attempt at one record (a retry after a failure, a takeover by another
// instance after its owner died) sends the provider the same key, so the
// provider deduplicates it; a new record under the same key (the old one
// expired or was swept) sends another, so the provider does not answer a
// new payment with the old charge. It returns "" when ctx carries no lease.
//
// Because the key names the record, the record must survive a crash before
// the key leaves: with a store whose claims may not yet be durable
// (storekit.ClaimSyncer: pgstore in transactional mode), the first RelayKey of an
// execution makes the claim durable (one round trip); if that fails, ctx is
// cancelled with the cause, so a provider call made with it fails too.
func RelayKey(ctx context.Context, label string) string {
	l, ok := leaseFrom(ctx)
	if !ok {
		return ""
	}
	l.synced.Do(func() { l.syncClaim(ctx) })
	return relayKeyV2(l.fence.Scope, l.fence.Key, l.born, l.fp, label)
}

// syncClaim makes the lease's claim durable (ClaimSyncer). When it cannot,
// the handler's context is cancelled with the cause, so a provider call
// made with it fails instead of charging under a key a crash could orphan.
func (l *grant) syncClaim(ctx context.Context) {
	s, ok := storekit.As[storekit.ClaimSyncer](l.store)
	if !ok {
		return
	}
	if err := s.SyncClaim(ctx, l.fence); err != nil && l.lose != nil {
		l.lose(fmt.Errorf("idem: relay key: the claim could not be made durable: %w", err))
	}
}

// RelayKeyOf returns the relay key RelayKey gives, under label, to the
// handler of every execution of r: for operators matching a record with
// the provider's records (which charge did this key make?), and for tests.
func (e *Engine) RelayKeyOf(r storekit.Record, label string) string {
	return relayKeyV2(r.Scope, r.Key, r.CreatedAt, r.Fingerprint, label)
}

// relayKeyV2 adds the record's incarnation: its CreatedAt, in microseconds
// (what SQL stores keep; every store returns the same instant from the
// claim that created the record, from each takeover and from Get, which
// core/storetest checks), and its fingerprint (every attempt at one record
// has the same; it also tells two records apart should a store's clock
// step back to the very microsecond).
func relayKeyV2(scope, key string, born time.Time, fp, label string) string {
	x := newHasher()
	defer x.release()
	x.field("idem-relay-v2")
	x.field(scope)
	x.field(key)
	x.field(strconv.FormatInt(born.UnixMicro(), 10))
	x.field(fp)
	x.field(label)
	return x.hexSum("idem_", 20)
}

// leaseCtx is the handler's context: a cancelCtx (so that context.Cause
// reports why it ended) carrying the lease, in one wrapper instead of a
// value context under the cancelCtx.
type leaseCtx struct {
	context.Context
	lease *grant
}

func (c *leaseCtx) Value(k any) any {
	if k == storekit.LeaseContextKey {
		return c.lease
	}
	return c.Context.Value(k)
}

// commitCtx is what Commit and Abort hand the store: the request's values
// and the lease, none of its cancellation, and a deadline. It is
// context.WithTimeout(context.WithoutCancel(ctx)) without the timer: the
// timer starts only when a store asks for Done or AfterFunc (pgx does;
// memstore only calls Err, which reads the clock), so a commit that nobody
// waits on costs no runtime timer. It lives in the decision's owner state:
// there is one per decision.
type commitCtx struct {
	values   context.Context // context.WithoutCancel(request ctx): values only
	lease    *grant
	deadline time.Time

	mu     sync.Mutex
	done   chan struct{}
	err    error
	timer  *time.Timer
	afters []*commitAfter
}

// commitAfter is one AfterFunc registration.
type commitAfter struct{ f func() }

var _ interface {
	AfterFunc(func()) func() bool
} = (*commitCtx)(nil)

func (c *commitCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *commitCtx) Value(k any) any {
	if k == storekit.LeaseContextKey {
		return c.lease
	}
	return c.values.Value(k)
}

func (c *commitCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && !time.Now().Before(c.deadline) {
		c.cancelLocked(context.DeadlineExceeded)
	}
	return c.err
}

func (c *commitCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchLocked()
	return c.done
}

// AfterFunc arranges for f to run in its own goroutine once c is done, as
// context.AfterFunc does. The context package uses it for contexts derived
// from c (and pgx through context.AfterFunc), instead of a goroutine
// watching Done for each.
func (c *commitCtx) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchLocked()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	a := &commitAfter{f: f}
	c.afters = append(c.afters, a)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.afters {
			if x == a {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				return true
			}
		}
		return false // already run, or c was cancelled
	}
}

// watchLocked makes the Done channel and, while c is live, the deadline's
// timer. c.mu must be held.
func (c *commitCtx) watchLocked() {
	if c.done != nil {
		return
	}
	c.done = make(chan struct{})
	if c.err != nil {
		close(c.done)
		return
	}
	left := time.Until(c.deadline)
	if left <= 0 {
		c.cancelLocked(context.DeadlineExceeded)
		return
	}
	c.timer = time.AfterFunc(left, func() { c.cancel(context.DeadlineExceeded) })
}

// cancel ends c with err (Commit and Abort call it with context.Canceled
// when the store call returns); later calls do nothing.
func (c *commitCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelLocked(err)
}

func (c *commitCtx) cancelLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	for _, a := range c.afters {
		go a.f()
	}
	c.afters = nil
}

// contextWithLease returns ctx carrying l.
func contextWithLease(ctx context.Context, l *grant) context.Context {
	return context.WithValue(ctx, storekit.LeaseContextKey, l)
}
