package core_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// A slow owner that is still alive keeps its lease: the heartbeat extends
// it, so duplicates keep getting 409 long after the lease would have lapsed,
// and the owner commits fine.
func TestHeartbeatKeepsSlowOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 300 * time.Millisecond
		s := &countingStore{Store: memstore.New()}
		eng := newEngine(t, s, core.WithLease(lease))
		owner := proceed(t, eng, request("slow", payBody))
		ctx := owner.Context(context.Background())

		deadline := time.Now().Add(1200 * time.Millisecond) // 4 leases
		probes := 0
		for time.Now().Before(deadline) {
			d := decide(t, eng, request("slow", payBody))
			require.Equal(t, core.Reject, d.Outcome, "probe %d after %v: a live owner was taken over", probes, time.Until(deadline))
			require.Equal(t, http.StatusConflict, d.Response.Status)
			probes++
			time.Sleep(50 * time.Millisecond)
		}
		assert.Greater(t, probes, 15)
		assert.NoError(t, ctx.Err(), "a live owner's context must not be cancelled")
		assert.GreaterOrEqual(t, s.heartbeats.Load(), int64(3), "heartbeats every lease/3")

		require.NoError(t, eng.Commit(ctx, owner, created("slow but done")))
		r := decide(t, eng, request("slow", payBody))
		require.Equal(t, core.Replay, r.Outcome)
		assert.Equal(t, "slow but done", string(r.Response.Body))

		// The heartbeat stops with the commit.
		n := s.heartbeats.Load()
		time.Sleep(2 * lease / 3)
		assert.Equal(t, n, s.heartbeats.Load(), "heartbeat still running after Commit")
	})
}

// A dead owner (no heartbeat: it was OOM-killed) is taken over once its
// lease lapses, and its late Commit is fenced off with ErrLeaseLost.
func TestDeadOwnerTakenOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 200 * time.Millisecond
		mem := memstore.New()
		// The dead instance: its heartbeats never reach the store.
		dead := newEngine(t, &faultStore{Store: mem, heartbeat: func(context.Context, storekit.Fence, time.Duration) error { return nil }}, core.WithLease(lease))
		alive := newEngine(t, mem, core.WithLease(lease))

		zombie := proceed(t, dead, request("k", payBody))
		requireProblem(t, decide(t, alive, request("k", payBody)), http.StatusConflict, problem.InFlight)

		var heir *core.Decision
		require.Eventually(t, func() bool {
			d := pollDecide(t, alive, request("k", payBody))
			if d == nil || d.Outcome == core.Proceed { // nil: Decide failed (reported), stop polling
				heir = d
				return true
			}
			return false
		}, 3*time.Second, 20*time.Millisecond, "the lapsed lease was never taken over")
		require.NotNil(t, heir)
		assert.Greater(t, heir.Fence().Token, zombie.Fence().Token, "a takeover bumps the token")

		require.NoError(t, alive.Commit(context.Background(), heir, created("heir")))
		err := dead.Commit(context.Background(), zombie, created("zombie"))
		require.ErrorIs(t, err, core.ErrLeaseLost)
		assert.ErrorIs(t, dead.Abort(context.Background(), zombie, nil), core.ErrFinished)

		r := decide(t, alive, request("k", payBody))
		require.Equal(t, core.Replay, r.Outcome)
		assert.Equal(t, "heir", string(r.Response.Body), "the stale owner must not overwrite the new owner's result")

		// The same with the zombie committing before the heir: still fenced.
		zombie = proceed(t, dead, request("k2", payBody))
		require.Eventually(t, func() bool {
			heir = pollDecide(t, alive, request("k2", payBody))
			return heir == nil || heir.Outcome == core.Proceed // nil: Decide failed (reported), stop polling
		}, 3*time.Second, 20*time.Millisecond)
		require.NotNil(t, heir)
		require.ErrorIs(t, dead.Commit(context.Background(), zombie, adapterkit.Response{Status: 500}), core.ErrLeaseLost)
		require.ErrorIs(t, dead.Abort(context.Background(), zombie, nil), core.ErrFinished)
		requireProblem(t, decide(t, alive, request("k2", payBody)), http.StatusConflict, problem.InFlight)
		require.NoError(t, alive.Commit(context.Background(), heir, created("heir2")))
	})
}

// When the heartbeat finds the lease gone (the owner stalled past its
// lease, e.g. a long GC pause or a partition, and was taken over), the
// handler's context is cancelled with a cause wrapping ErrLeaseLost.
func TestHeartbeatLeaseLostCancelsHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 300 * time.Millisecond
		mem := memstore.New()
		var stalled atomic.Bool
		stalled.Store(true)
		owner := newEngine(t, &faultStore{Store: mem, heartbeat: func(ctx context.Context, f storekit.Fence, d time.Duration) error {
			if stalled.Load() {
				return nil // the heartbeat is lost on the way
			}
			return mem.Heartbeat(ctx, f, d)
		}}, core.WithLease(lease))
		other := newEngine(t, mem, core.WithLease(lease))

		d := proceed(t, owner, request("k", payBody))
		ctx := d.Context(context.Background())

		var heir *core.Decision
		require.Eventually(t, func() bool {
			heir = pollDecide(t, other, request("k", payBody))
			return heir == nil || heir.Outcome == core.Proceed // nil: Decide failed (reported), stop polling
		}, 3*time.Second, 20*time.Millisecond)
		require.NotNil(t, heir)
		stalled.Store(false) // the next heartbeat reaches the store and finds the lease gone

		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("handler context not cancelled after the lease was lost")
		}
		cause := context.Cause(ctx)
		assert.ErrorIs(t, cause, core.ErrLeaseLost)
		assert.ErrorIs(t, ctx.Err(), context.Canceled)
		// Contexts derived later are born cancelled with the same cause.
		assert.ErrorIs(t, context.Cause(d.Context(context.Background())), core.ErrLeaseLost)

		require.ErrorIs(t, owner.Commit(ctx, d, created("stale")), core.ErrLeaseLost)
		require.NoError(t, other.Commit(context.Background(), heir, created("fresh")))
		assert.Equal(t, "fresh", string(decide(t, other, request("k", payBody)).Response.Body))
	})
}

// A store that cannot be reached for a whole lease may already have handed
// the key to another instance: the handler is stopped.
func TestHeartbeatFailingForWholeLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 300 * time.Millisecond
		var mu sync.Mutex
		var events []core.Event
		eng := newEngine(t, &faultStore{Store: memstore.New(), heartbeat: func(context.Context, storekit.Fence, time.Duration) error {
			return errors.New("store unreachable")
		}}, core.WithLease(lease), core.WithObserver(func(ev core.Event) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}))
		start := time.Now()
		d := proceed(t, eng, request("k", payBody))
		ctx := d.Context(context.Background())
		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("handler context not cancelled")
		}
		assert.GreaterOrEqual(t, time.Since(start), lease, "one failed heartbeat must not stop the handler")
		assert.ErrorIs(t, context.Cause(ctx), core.ErrLeaseLost)
		_ = eng.Abort(context.Background(), d, context.Cause(ctx))
		mu.Lock()
		defer mu.Unlock()
		var hbErrors int
		for _, ev := range events {
			if ev.Kind == "heartbeat_error" {
				hbErrors++
				assert.Error(t, ev.Err)
			}
		}
		assert.GreaterOrEqual(t, hbErrors, 2)
	})
}

// When the owner cannot renew its lease, its handler must be stopped no
// later than the moment another instance may take the key over. The lease
// in the store runs from when the store applied the last renewal (or the
// claim), which is before its reply reached the owner: counting the whole
// lease from the reply, or only checking on the next heartbeat tick, leaves
// the handler running alongside the new owner.
func TestHeartbeatLossCancelsHandlerNoLaterThanTakeover(t *testing.T) {
	const lease = 600 * time.Millisecond
	const slowReply = 180 * time.Millisecond // < lease/3: the call still "succeeds"

	run := func(t *testing.T, claimReply, hbReply time.Duration) {
		mem := memstore.New()
		var hbCalls atomic.Int64
		owner := newEngine(t, &faultStore{
			Store: mem,
			claim: func(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
				res, err := mem.Claim(ctx, r)
				time.Sleep(claimReply) // the reply is slow to come back
				return res, err
			},
			heartbeat: func(ctx context.Context, f storekit.Fence, d time.Duration) error {
				if hbCalls.Add(1) == 1 && hbReply > 0 {
					err := mem.Heartbeat(ctx, f, d) // applied at once...
					time.Sleep(hbReply)             // ...acknowledged late
					return err
				}
				return errors.New("store unreachable from this instance")
			},
		}, core.WithLease(lease))
		other := newEngine(t, mem, core.WithLease(lease))

		d := proceed(t, owner, request("k", payBody))
		ctx := d.Context(context.Background())
		var cancelledAt atomic.Int64
		stop := context.AfterFunc(ctx, func() { cancelledAt.Store(time.Now().UnixNano()) })
		defer stop()

		var heir *core.Decision
		require.Eventually(t, func() bool {
			heir = pollDecide(t, other, request("k", payBody))
			return heir == nil || heir.Outcome == core.Proceed // nil: Decide failed (reported), stop polling
		}, 5*time.Second, 5*time.Millisecond, "never taken over")
		require.NotNil(t, heir)
		takenOver := time.Now()

		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("owner's handler never cancelled")
		}
		require.ErrorIs(t, context.Cause(ctx), core.ErrLeaseLost)
		if late := time.Unix(0, cancelledAt.Load()).Sub(takenOver); late > 60*time.Millisecond {
			t.Errorf("the owner's handler kept running %v after another instance took its key over", late)
		}
		_ = owner.Abort(context.Background(), d, nil)
		require.NoError(t, other.Commit(context.Background(), heir, created("heir")))
	}
	// In a bubble: the store's slow replies take simulated time, and the
	// owner's lateness is measured on that clock, not the loaded machine's.
	t.Run("slow heartbeat reply", func(t *testing.T) { synctest.Test(t, func(t *testing.T) { run(t, 0, slowReply) }) })
	t.Run("slow claim reply", func(t *testing.T) { synctest.Test(t, func(t *testing.T) { run(t, slowReply, 0) }) })
}

// A transient heartbeat error does not stop a handler whose next heartbeat
// succeeds.
func TestHeartbeatTransientError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 300 * time.Millisecond
		mem := memstore.New()
		var calls atomic.Int64
		eng := newEngine(t, &faultStore{Store: mem, heartbeat: func(ctx context.Context, f storekit.Fence, d time.Duration) error {
			if calls.Add(1)%2 == 1 {
				return errors.New("blip")
			}
			return mem.Heartbeat(ctx, f, d)
		}}, core.WithLease(lease))
		d := proceed(t, eng, request("k", payBody))
		ctx := d.Context(context.Background())
		time.Sleep(4 * lease)
		assert.NoError(t, ctx.Err())
		assert.GreaterOrEqual(t, calls.Load(), int64(6))
		require.NoError(t, eng.Commit(ctx, d, created("ok")))
	})
}

// Claims wait for their first renewal in one queue per engine: one that
// finishes early leaves it from the middle, the slow ones around it still
// get their renewals, and each renewal loop stops with its own Commit.
func TestHeartbeatQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 150 * time.Millisecond
		s := &countingStore{Store: memstore.New()}
		eng := newEngine(t, s, core.WithLease(lease))
		a := proceed(t, eng, request("q-a", payBody))
		b := proceed(t, eng, request("q-b", payBody))
		c := proceed(t, eng, request("q-c", payBody))
		require.NoError(t, eng.Commit(context.Background(), b, created("b")))

		time.Sleep(2 * lease) // past the lease: a and c live only by their renewals
		for _, key := range []string{"q-a", "q-c"} {
			d := decide(t, eng, request(key, payBody))
			require.Equal(t, core.Reject, d.Outcome, "%s was taken over: no renewal", key)
		}
		assert.GreaterOrEqual(t, s.heartbeats.Load(), int64(4), "a and c renew every lease/3")

		require.NoError(t, eng.Commit(context.Background(), a, created("a")))
		require.NoError(t, eng.Commit(context.Background(), c, created("c")))
		n := s.heartbeats.Load()
		time.Sleep(2 * lease / 3)
		assert.Equal(t, n, s.heartbeats.Load(), "renewals after Commit")

		// The queue is reused once empty.
		d := proceed(t, eng, request("q-d", payBody))
		time.Sleep(2 * lease)
		assert.Greater(t, s.heartbeats.Load(), n, "a claim after the queue emptied gets renewals too")
		require.NoError(t, eng.Commit(context.Background(), d, created("d")))
	})
}

// Commit must not wait for a renewal that is stuck in the store (a pool
// with no free connection, a slow network): the renewal is moot once the
// execution is over, and waiting for it delays the client's response by up
// to lease/3 (10s with the default lease) although Commit itself would go
// through at once.
func TestCommitDoesNotWaitForStuckHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		mem := memstore.New()
		started := make(chan struct{}, 1)
		eng := newEngine(t, &faultStore{Store: mem, heartbeat: func(ctx context.Context, f storekit.Fence, d time.Duration) error {
			select {
			case started <- struct{}{}:
			default:
			}
			<-ctx.Done() // stuck until its deadline
			return ctx.Err()
		}}, core.WithLease(lease))
		d := proceed(t, eng, request("k", payBody))
		select {
		case <-started:
		case <-time.After(3 * time.Second):
			t.Fatal("no heartbeat")
		}
		// In the bubble the clock moves only when every goroutine is blocked:
		// a Commit that waited for the stuck renewal would let it run to its
		// deadline, one that does not wait takes no time at all.
		start := time.Now()
		require.NoError(t, eng.Commit(context.Background(), d, created("done")))
		if took := time.Since(start); took != 0 {
			t.Errorf("Commit took %v (simulated) waiting for a stuck heartbeat", took)
		}
		require.Equal(t, core.Replay, decide(t, eng, request("k", payBody)).Outcome)
	})
}
