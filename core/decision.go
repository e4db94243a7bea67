package core

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/core/adapterkit"
)

// Decision is the result of Decide. For Proceed it holds the lease until
// Commit or Abort, which must be called exactly once.
type Decision struct {
	Outcome Outcome
	// Response is what to write for Replay and Reject. Its header map is
	// the decision's own; for a Replay, the header values and the body are
	// shared with the store and must not be modified in place (an append
	// to a value slice reallocates).
	Response *adapterkit.Response
	// Problem is the machine-readable reason of a Reject: a problem name
	// (problem.InFlight, problem.PayloadMismatch, ...; problem.Lookup gives
	// its status and title). "" for Bypass, Proceed and Replay.
	Problem string
	// Body is the request body as Decide read it; the adapter hands it to
	// the handler. BodyRead tells whether Decide consumed Request.Body at all.
	Body     []byte
	BodyRead bool
	// Key and Scope of the request ("" on Bypass).
	Key   string
	Scope string

	eng   *Engine
	lease *grant // &own.lease for Proceed, else nil
	route string
	own   *owner // Proceed only: replays and rejects stay one small allocation
}

// answer sets the decision's outcome and response.
func (d *Decision) answer(o Outcome, problem string, resp *adapterkit.Response) {
	d.Outcome, d.Problem, d.Response = o, problem, resp
}

// owner is the state of a Proceed decision, allocated once at the claim:
// the lease, the handler's context, the commit context and the heartbeat
// live here rather than in one allocation each.
type owner struct {
	lease  grant
	lctx   leaseCtx  // the first Context's; later calls allocate their own
	lctxOK bool      // lctx is in use
	cctx   commitCtx // Commit's or Abort's (there is exactly one)
	// proceed is what Serve hands the adapter's Exchange.Next.
	proceed adapterkit.Proceed

	mu        sync.Mutex
	finished  bool
	lostErr   error
	cancels   []context.CancelCauseFunc
	cancelBuf [1]context.CancelCauseFunc // cancels' first element
	hbCancel  context.CancelFunc         // the renewal in progress, if any
	hbStop    chan struct{}              // made when the renewal loop starts
	hbLoop    sync.WaitGroup             // held from the claim until the loop may no longer start or has returned

	// In the engine's hbQueue until the first renewal is due (guarded by
	// the queue's lock).
	d          *Decision
	prev, next *owner
	queued     bool
	due        time.Time
	hbSince    time.Time // when the claim was sent
}

// lostLease returns why the heartbeat found the lease gone, or nil.
func (d *Decision) lostLease() error {
	if d == nil || d.own == nil {
		return nil
	}
	d.own.mu.Lock()
	defer d.own.mu.Unlock()
	return d.own.lostErr
}

// Context returns parent carrying the lease (for KeyFromContext, RelayKey
// and stores such as pgstore.Tx), cancelled with a cause wrapping
// ErrLeaseLost if the heartbeat finds the lease gone. For other outcomes it
// returns parent unchanged.
func (d *Decision) Context(parent context.Context) context.Context {
	if d == nil || d.own == nil {
		return parent
	}
	o := d.own
	// One cancelCtx (context.Cause needs the real one) wrapped by a
	// leaseCtx carrying the lease, instead of a value context under it.
	cc, cancel := context.WithCancelCause(parent)
	o.mu.Lock()
	defer o.mu.Unlock()
	lc := &o.lctx
	if o.lctxOK {
		lc = new(leaseCtx)
	}
	o.lctxOK = true
	*lc = leaseCtx{Context: cc, lease: &o.lease}
	switch {
	case o.lostErr != nil:
		cancel(o.lostErr)
	case o.finished:
		cancel(ErrFinished)
	default:
		if o.cancels == nil {
			o.cancels = o.cancelBuf[:0]
		}
		o.cancels = append(o.cancels, cancel)
	}
	return lc
}
