package memstore_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(testing.TB) core.Store { return memstore.New() })
}

func BenchmarkStore(b *testing.B) {
	storetest.Benchmark(b, func(testing.TB) core.Store { return memstore.New() })
}

// fakeClock is a settable clock for WithClock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func req(key string) storekit.ClaimRequest {
	return storekit.ClaimRequest{
		Scope: "tenant", Key: key, Method: http.MethodPost, Route: "/v1/payments",
		Fingerprint: "fp", Lease: 10 * time.Second, Retention: time.Hour,
	}
}

func fence(r storekit.Record) storekit.Fence {
	return storekit.Fence{Scope: r.Scope, Key: r.Key, Token: r.Token}
}

func TestClaimTimesFollowClock(t *testing.T) {
	clk := newFakeClock()
	s := memstore.New(memstore.WithClock(clk.Now))
	ctx := t.Context()
	start := clk.Now()

	res, err := s.Claim(ctx, req("k"))
	require.NoError(t, err)
	require.True(t, res.Claimed)
	assert.Equal(t, start, res.Now)
	assert.Equal(t, start, res.Record.CreatedAt)
	assert.Equal(t, start.Add(10*time.Second), res.Record.LockedUntil)
	assert.Equal(t, start.Add(time.Hour), res.Record.ExpiresAt)

	// LockedUntil == now counts as lapsed: takeover.
	clk.Advance(10 * time.Second)
	again, err := s.Claim(ctx, req("k"))
	require.NoError(t, err)
	require.True(t, again.Claimed)
	assert.Greater(t, again.Record.Token, res.Record.Token)
	assert.Equal(t, start, again.Record.CreatedAt, "takeover keeps CreatedAt")
	assert.Equal(t, clk.Now().Add(10*time.Second), again.Record.LockedUntil)
	assert.Equal(t, clk.Now().Add(time.Hour), again.Record.ExpiresAt)

	// Just before lapsing: not taken over.
	clk.Advance(10*time.Second - time.Nanosecond)
	third, err := s.Claim(ctx, req("k"))
	require.NoError(t, err)
	require.False(t, third.Claimed)
	assert.Equal(t, again.Record, third.Record)
}

func TestRetentionBoundary(t *testing.T) {
	clk := newFakeClock()
	s := memstore.New(memstore.WithClock(clk.Now))
	ctx := t.Context()
	first, err := s.Claim(ctx, req("k"))
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, fence(first.Record), storekit.StoredResponse{Status: 201}))

	clk.Advance(time.Hour - time.Nanosecond)
	rec, err := s.Get(ctx, "tenant", "k")
	require.NoError(t, err, "not expired one nanosecond before ExpiresAt")
	assert.Equal(t, storekit.StatusCompleted, rec.Status)

	clk.Advance(time.Nanosecond) // ExpiresAt == now: expired
	_, err = s.Get(ctx, "tenant", "k")
	require.ErrorIs(t, err, storekit.ErrNotFound, "expired records are dropped on access")
	assert.Equal(t, 0, s.Len())

	other := req("k")
	other.Fingerprint = "another"
	res, err := s.Claim(ctx, other)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	assert.Greater(t, res.Record.Token, first.Record.Token, "tokens are never reused after a delete")
	assert.Equal(t, clk.Now(), res.Record.CreatedAt, "a new record gets a new CreatedAt")
	assert.Equal(t, "another", res.Record.Fingerprint)
}

func TestExpiredRecordRefusesOwner(t *testing.T) {
	// Past retention with a lapsed lease the key is new again, so even the
	// token holder can no longer write: every method sees it as absent.
	clk := newFakeClock()
	s := memstore.New(memstore.WithClock(clk.Now))
	ctx := t.Context()
	r := req("k")
	r.Retention = 5 * time.Second
	res, err := s.Claim(ctx, r)
	require.NoError(t, err)

	clk.Advance(6 * time.Second) // past retention, lease still live
	require.NoError(t, s.Heartbeat(ctx, fence(res.Record), time.Second), "a live lease keeps the record")

	clk.Advance(time.Second) // lease lapsed too
	require.ErrorIs(t, s.Complete(ctx, fence(res.Record), storekit.StoredResponse{Status: 200}), core.ErrLeaseLost)
	require.ErrorIs(t, s.Fail(ctx, fence(res.Record)), core.ErrLeaseLost)
	require.ErrorIs(t, s.Heartbeat(ctx, fence(res.Record), time.Second), core.ErrLeaseLost)
	assert.Equal(t, 0, s.Len())
}

func TestPurge(t *testing.T) {
	clk := newFakeClock()
	s := memstore.New(memstore.WithClock(clk.Now))
	ctx := t.Context()

	short := func(key string, lease time.Duration) storekit.Record {
		r := req(key)
		r.Lease, r.Retention = lease, time.Minute
		res, err := s.Claim(ctx, r)
		require.NoError(t, err)
		return res.Record
	}
	done := short("done", time.Second)
	require.NoError(t, s.Complete(ctx, fence(done), storekit.StoredResponse{Status: 200}))
	failed := short("failed", time.Second)
	require.NoError(t, s.Fail(ctx, fence(failed)))
	short("lapsed", time.Second)
	short("live", 2*time.Minute)
	keep, err := s.Claim(ctx, req("keep"))
	require.NoError(t, err)
	require.Equal(t, 5, s.Len())

	n, err := s.Purge(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, n, "nothing is past retention yet")

	clk.Advance(time.Minute)
	n, err = s.Purge(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n, "completed, failed and lapsed records past retention")
	assert.Equal(t, 2, s.Len())
	_, err = s.Get(ctx, "tenant", "live")
	require.NoError(t, err, "a record held by a live lease is kept past retention")
	_, err = s.Get(ctx, "tenant", keep.Record.Key)
	require.NoError(t, err)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	clk.Advance(2 * time.Minute)
	_, err = s.Purge(cctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 2, s.Len(), "a cancelled Purge removes nothing")
}

func TestMaxEntries(t *testing.T) {
	clk := newFakeClock()
	s := memstore.New(memstore.WithClock(clk.Now), memstore.WithMaxEntries(2))
	ctx := t.Context()

	a, err := s.Claim(ctx, req("a"))
	require.NoError(t, err)
	b := req("b")
	b.Retention = time.Minute
	bRes, err := s.Claim(ctx, b)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, fence(bRes.Record), storekit.StoredResponse{Status: 200}))

	_, err = s.Claim(ctx, req("c"))
	require.ErrorIs(t, err, memstore.ErrFull)
	assert.Equal(t, 2, s.Len(), "a full store evicts nothing")

	// Keys already held still work: replay and takeover need no room.
	replay, err := s.Claim(ctx, b)
	require.NoError(t, err)
	assert.False(t, replay.Claimed)
	require.NoError(t, s.Fail(ctx, fence(a.Record)))
	takeover, err := s.Claim(ctx, req("a"))
	require.NoError(t, err)
	assert.True(t, takeover.Claimed)

	// Once b expires, a new key purges it and fits.
	clk.Advance(time.Minute)
	c, err := s.Claim(ctx, req("c"))
	require.NoError(t, err)
	assert.True(t, c.Claimed)
	assert.Equal(t, 2, s.Len())
	_, err = s.Get(ctx, "tenant", "a")
	require.NoError(t, err, "the live record survived")
}

func TestOptions(t *testing.T) {
	s := memstore.New(nil, memstore.WithClock(nil), memstore.WithMaxEntries(-1))
	for i := range 100 {
		_, err := s.Claim(t.Context(), req(string(rune('a'+i%26))+string(rune('0'+i/26))))
		require.NoError(t, err, "negative max entries means unbounded")
	}
	res, err := s.Claim(t.Context(), req("x"))
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now(), res.Now, time.Minute, "a nil clock keeps time.Now")
}

func TestInvalidDurations(t *testing.T) {
	s := memstore.New()
	ctx := t.Context()
	for _, r := range []storekit.ClaimRequest{
		func() storekit.ClaimRequest { r := req("k"); r.Lease = 0; return r }(),
		func() storekit.ClaimRequest { r := req("k"); r.Retention = -time.Second; return r }(),
	} {
		_, err := s.Claim(ctx, r)
		require.Error(t, err)
	}
	assert.Equal(t, 0, s.Len())

	res, err := s.Claim(ctx, req("k"))
	require.NoError(t, err)
	require.Error(t, s.Heartbeat(ctx, fence(res.Record), 0))
	rec, err := s.Get(ctx, "tenant", "k")
	require.NoError(t, err)
	assert.Equal(t, res.Record.LockedUntil, rec.LockedUntil)
}

func TestErrorsHaveContext(t *testing.T) {
	s := memstore.New()
	err := s.Complete(t.Context(), storekit.Fence{Scope: "s", Key: "k", Token: 1}, storekit.StoredResponse{})
	require.True(t, errors.Is(err, core.ErrLeaseLost))
	assert.Equal(t, "memstore: complete: idem: lease lost", err.Error())
	_, err = s.Get(t.Context(), "s", "k")
	assert.Equal(t, "memstore: get: idem: record not found", err.Error())
}

func TestMaxEntriesNoticesEarlierExpiry(t *testing.T) {
	// A full store skips rescanning until something can have expired; a
	// Complete that lets a record expire sooner than its lease must count.
	clk := newFakeClock()
	s := memstore.New(memstore.WithClock(clk.Now), memstore.WithMaxEntries(1))
	ctx := t.Context()
	a := req("a")
	a.Lease, a.Retention = 2*time.Hour, time.Hour
	res, err := s.Claim(ctx, a)
	require.NoError(t, err)

	_, err = s.Claim(ctx, req("b"))
	require.ErrorIs(t, err, memstore.ErrFull, "a is held by its lease for 2h")

	require.NoError(t, s.Complete(ctx, fence(res.Record), storekit.StoredResponse{Status: 200}))
	clk.Advance(time.Hour)
	b, err := s.Claim(ctx, req("b"))
	require.NoError(t, err, "a completed and expired after 1h, not 2h")
	assert.True(t, b.Claimed)

}

func TestMaxEntriesNoticesShorterRetention(t *testing.T) {
	clk := newFakeClock()
	s := memstore.New(memstore.WithClock(clk.Now), memstore.WithMaxEntries(2))
	ctx := t.Context()
	_, err := s.Claim(ctx, req("x")) // held 1h
	require.NoError(t, err)
	n, err := s.Purge(ctx) // the store now knows nothing expires before 1h
	require.NoError(t, err)
	require.Zero(t, n)

	y := req("y")
	y.Lease, y.Retention = time.Second, time.Minute
	_, err = s.Claim(ctx, y)
	require.NoError(t, err)
	_, err = s.Claim(ctx, req("z"))
	require.ErrorIs(t, err, memstore.ErrFull)

	clk.Advance(time.Minute)
	_, err = s.Claim(ctx, req("z"))
	require.NoError(t, err, "y expired after its own 1m retention, before x's 1h")
}

func TestZeroStore(t *testing.T) {
	var s memstore.Store
	storetest.Run(t, func(testing.TB) core.Store { return new(memstore.Store) })
	_, err := s.Claim(t.Context(), req("k"))
	require.NoError(t, err)
	ch, release := s.Watch(t.Context(), "tenant", "other")
	release()
	<-ch
	assert.Equal(t, 1, s.Len())
}
