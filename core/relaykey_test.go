package core_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

// Relay keys are per record: the same for every attempt at one record (a
// retry after a failure, a takeover after its owner died), another for a
// new record under the same key (after expiry, after a purge), even with
// the same body. core/storetest checks the same through every store, on
// their own clocks; here memstore's clock is driven.

type relayClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *relayClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *relayClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// silentOwner swallows heartbeats: its owner looks dead to the store.
type silentOwner struct{ core.Store }

func (silentOwner) Heartbeat(context.Context, storekit.Fence, time.Duration) error { return nil }

func relayReq(scope, key, body string) core.Request {
	return core.Request{Method: http.MethodPost, Route: "/pay", Target: "/pay", Scope: scope,
		Header: http.Header{"Idempotency-Key": {key}}, Body: strings.NewReader(body)}
}

// proceedRelay decides req, requires Proceed, and returns the decision and
// the relay key its handler would send.
func proceedRelay(t *testing.T, eng *core.Engine, req core.Request) (*core.Decision, string) {
	t.Helper()
	d := proceed(t, eng, req)
	relay := core.RelayKey(d.Context(context.Background()), "charge")
	require.True(t, strings.HasPrefix(relay, "idem_"), relay)
	return d, relay
}

func TestRelayKeyPerRecord(t *testing.T) {
	const lease, retention = time.Second, time.Hour
	clock := &relayClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	store := memstore.New(memstore.WithClock(clock.Now))
	eng, err := core.New(store, core.WithLease(lease), core.WithRetention(retention))
	require.NoError(t, err)
	dead, err := core.New(silentOwner{store}, core.WithLease(lease), core.WithRetention(retention))
	require.NoError(t, err)
	const body = `{"amount":1000}`
	ctx := context.Background()

	d, first := proceedRelay(t, eng, relayReq("u1", "k1", body))
	require.NoError(t, eng.Commit(ctx, d, adapterkit.Response{Status: http.StatusBadGateway}))

	clock.Advance(time.Minute)
	d, relay := proceedRelay(t, eng, relayReq("u1", "k1", body))
	assert.Equal(t, first, relay, "a retry after a failure relays the first attempt's key")
	require.NoError(t, eng.Commit(ctx, d, adapterkit.Response{Status: http.StatusBadGateway}))

	zombie, relay := proceedRelay(t, dead, relayReq("u1", "k1", body))
	assert.Equal(t, first, relay, "another engine taking the failed record over")
	clock.Advance(2 * lease) // the owner died: its lease lapses
	d, relay = proceedRelay(t, eng, relayReq("u1", "k1", body))
	assert.Equal(t, first, relay, "a takeover after the owner died relays the first attempt's key")
	assert.ErrorIs(t, dead.Commit(ctx, zombie, adapterkit.Response{Status: http.StatusCreated}), core.ErrLeaseLost)
	require.NoError(t, eng.Commit(ctx, d, created(`{"id":"pay_1"}`)))
	assert.Equal(t, core.Replay, decide(t, eng, relayReq("u1", "k1", body)).Outcome)

	// Past retention the key is new again: a new payment, a new relay key,
	// though the body is the same.
	clock.Advance(retention + time.Second)
	d, second := proceedRelay(t, eng, relayReq("u1", "k1", body))
	assert.NotEqual(t, first, second, "a new record after expiry must not relay the old record's key")
	require.NoError(t, eng.Commit(ctx, d, created(`{"id":"pay_2"}`)))

	// Purged, then used again.
	clock.Advance(retention + time.Second)
	n, err := store.Purge(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = store.Get(ctx, "u1", "k1")
	require.True(t, errors.Is(err, storekit.ErrNotFound), "purged: %v", err)
	d, third := proceedRelay(t, eng, relayReq("u1", "k1", body))
	assert.NotEqual(t, first, third, "a new record after a purge")
	assert.NotEqual(t, second, third, "a new record after a purge")
	require.NoError(t, eng.Commit(ctx, d, created(`{"id":"pay_3"}`)))

	// Other scope, other key, other label: other relay keys, at one instant.
	clock.Advance(retention + time.Second)
	seen := map[string]string{}
	for _, c := range [][2]string{{"u1", "k1"}, {"u2", "k1"}, {"u1", "k2"}, {"u1k", "1"}, {"u", "1k1"}} {
		d, relay := proceedRelay(t, eng, relayReq(c[0], c[1], body))
		if prev, dup := seen[relay]; dup {
			t.Errorf("%v relays %v's key", c, prev)
		}
		seen[relay] = c[0] + "/" + c[1]
		if other := core.RelayKey(d.Context(ctx), "refund"); other == relay || other == "" {
			t.Errorf("label refund: %q, label charge: %q", other, relay)
		}
		require.NoError(t, eng.Commit(ctx, d, created(`{}`)))
	}
}

// TestRelayKeyGolden pins the derivation: relay keys are sent to
// providers, so an optimisation must never change a bit of them.
func TestRelayKeyGolden(t *testing.T) {
	born := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	for _, c := range []struct {
		name string
		opts []core.Option
		want string
	}{
		{"per record", nil, "idem_4e7a6bb68c8ac7709e0455ff49c3b6a3b089c9db"},
	} {
		t.Run(c.name, func(t *testing.T) {
			eng := newEngine(t, memstore.New(memstore.WithClock(func() time.Time { return born })), c.opts...)
			d, relay := proceedRelay(t, eng, relayReq("u1", "k1", `{"amount":1000}`))
			assert.Equal(t, c.want, relay)
			rec, err := eng.Store().Get(context.Background(), "u1", "k1")
			require.NoError(t, err)
			assert.Equal(t, relay, eng.RelayKeyOf(rec, "charge"), "RelayKeyOf the record")
			require.NoError(t, eng.Abort(context.Background(), d, nil))
		})
	}
	// A lease that names no record (NewLease, for stores' tests).
	ctx := storetest.ContextWithLease(t.Context(), storetest.NewLease(nil, storekit.Fence{Scope: "u1", Key: "k1", Token: 3}))
	assert.Equal(t, "idem_eaf6f2812924b7bee1455d2a32d4494152bed708", core.RelayKey(ctx, "charge"))
}
