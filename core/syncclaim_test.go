package core_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// syncingStore is a store whose claims are not durable when Claim returns
// (as pgstore's in transactional mode): it counts the SyncClaim calls the
// engine makes and fails them on demand.
type syncingStore struct {
	core.Store
	mu    sync.Mutex
	syncs []storekit.Fence
	err   error
}

func (s *syncingStore) SyncClaim(_ context.Context, f storekit.Fence) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncs = append(s.syncs, f)
	return s.err
}

func (s *syncingStore) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.syncs)
}

// wrappedSyncer hides the syncer behind a decorator (as otelidem's store
// does): the engine must still find it.
type wrappedSyncer struct{ core.Store }

func (w wrappedSyncer) Unwrap() core.Store { return w.Store }

// A relay key names its record's incarnation: before the first one leaves
// an execution, the claim must be durable, or a crash that loses the claim
// lets the retry create another record and relay another key (a second
// charge). TestCrashPostgres shows that end to end on pgstore.
func TestRelayKeySyncsClaimFirst(t *testing.T) {
	s := &syncingStore{Store: memstore.New()}
	eng, err := core.New(wrappedSyncer{s}, core.WithSharedKeySpace())
	require.NoError(t, err)

	d, relay := proceedRelay(t, eng, relayReq("", "k1", `{"a":1}`))
	ctx := d.Context(context.Background())
	require.Equal(t, 1, s.calls(), "the claim was not made durable before its relay key left")
	assert.Equal(t, d.Fence(), s.syncs[0])
	// Once per execution: later keys (other labels) cost nothing.
	assert.NotEmpty(t, core.RelayKey(ctx, "refund"))
	assert.Equal(t, relay, core.RelayKey(ctx, "charge"))
	assert.Equal(t, 1, s.calls())
	assert.NoError(t, ctx.Err())
}

// When the claim cannot be made durable, the key is still returned (the
// handler's code goes on) but its context is cancelled with the cause, so a
// provider call made with it fails instead of charging.
func TestRelayKeySyncFailureCancelsHandler(t *testing.T) {
	boom := errors.New("store: connection reset")
	s := &syncingStore{Store: memstore.New(), err: boom}
	eng, err := core.New(s, core.WithSharedKeySpace())
	require.NoError(t, err)

	d := proceed(t, eng, relayReq("", "k1", `{"a":1}`))
	ctx := d.Context(context.Background())
	require.NoError(t, ctx.Err())
	assert.NotEmpty(t, core.RelayKey(ctx, "charge"))
	require.Error(t, ctx.Err(), "the handler's context survived a claim that could not be made durable")
	assert.ErrorIs(t, context.Cause(ctx), boom)
}
