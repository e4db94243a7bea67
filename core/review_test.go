package core_test

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/internal/testkit/require"
)

// When the owner cannot renew its lease, its handler must be stopped no
// later than the moment another instance may take the key over. The lease
// in the store runs from when the store applied the last renewal (or the
// claim), which is before its reply reached the owner: counting the whole
// lease from the reply, or only checking on the next heartbeat tick, leaves
// the handler running alongside the new owner.
func TestReviewHeartbeatLossNoLaterThanTakeover(t *testing.T) {
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
			heir = decide(t, other, request("k", payBody))
			return heir.Outcome == core.Proceed
		}, 5*time.Second, 5*time.Millisecond, "never taken over")
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

// Commit must not wait for a renewal that is stuck in the store (a pool
// with no free connection, a slow network): the renewal is moot once the
// execution is over, and waiting for it delays the client's response by up
// to lease/3 (10s with the default lease) although Commit itself would go
// through at once.
func TestReviewCommitDoesNotWaitForStuckHeartbeat(t *testing.T) {
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

// WithMaxRequestBytes(math.MaxInt64) is the natural way to say "no limit";
// New accepts it, so Decide must not panic on the first request with a
// body (limit+1 overflowed and the read slice had a negative length).
func TestReviewMaxRequestBytesMaxInt64(t *testing.T) {
	eng := newEngine(t, memstore.New(), core.WithMaxRequestBytes(math.MaxInt64))
	var d *core.Decision
	require.NotPanics(t, func() { d = proceed(t, eng, request("k", payBody)) })
	require.Equal(t, payBody, string(d.Body))
	require.NoError(t, eng.Commit(context.Background(), d, created("ok")))
}
