package memstore

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (s *Store) watcherCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ws := range s.watchers {
		n += len(ws)
	}
	return n
}

func TestWatch(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	s := New(WithClock(func() time.Time { return now }))
	ctx := t.Context()
	req := storekit.ClaimRequest{
		Scope: "s", Key: "k", Method: http.MethodPost, Route: "/r", Fingerprint: "fp",
		Lease: time.Second, Retention: time.Minute,
	}
	res, err := s.Claim(ctx, req)
	require.NoError(t, err)
	f := storekit.Fence{Scope: "s", Key: "k", Token: res.Record.Token}

	// Each change wakes the watchers of its key, and only those.
	steps := []struct {
		name   string
		change func()
	}{
		{"heartbeat", func() { require.NoError(t, s.Heartbeat(ctx, f, time.Second)) }},
		{"fail", func() { require.NoError(t, s.Fail(ctx, f)) }},
		{"takeover", func() {
			res, err := s.Claim(ctx, req)
			require.NoError(t, err)
			require.True(t, res.Claimed)
			f.Token = res.Record.Token
		}},
		{"complete", func() { require.NoError(t, s.Complete(ctx, f, storekit.StoredResponse{Status: 201})) }},
		{"expiry", func() {
			now = now.Add(time.Minute)
			_, err := s.Get(ctx, "s", "k")
			require.ErrorIs(t, err, storekit.ErrNotFound)
		}},
		{"insert", func() {
			res, err := s.Claim(ctx, req)
			require.NoError(t, err)
			require.True(t, res.Claimed)
		}},
	}
	for _, st := range steps {
		ch, release := s.Watch(ctx, "s", "k")
		other, releaseOther := s.Watch(ctx, "s", "other")
		assert.False(t, closed(ch), "%s: not closed before the change", st.name)
		st.change()
		assert.True(t, closed(ch), "%s: closed by the change", st.name)
		assert.False(t, closed(other), "%s: another key's watcher sleeps on", st.name)
		release()
		release() // idempotent
		releaseOther()
		assert.True(t, closed(other), "release closes the channel")
	}

	// A replay (Claim returning the record unchanged) is no change.
	ch, release := s.Watch(ctx, "s", "k")
	_, err = s.Claim(ctx, req)
	require.NoError(t, err)
	assert.False(t, closed(ch))
	release()
	assert.Equal(t, 0, s.watcherCount())
}

func TestWatchContext(t *testing.T) {
	s := New()
	cctx, cancel := context.WithCancel(t.Context())
	cancel()
	ch, release := s.Watch(cctx, "s", "k")
	assert.True(t, closed(ch), "a done context wakes at once")
	release()

	ctx, cancel := context.WithCancel(t.Context())
	ch, release = s.Watch(ctx, "s", "k")
	defer release()
	require.Equal(t, 1, s.watcherCount())
	cancel()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the context must close the channel")
	}
	assert.Equal(t, 0, s.watcherCount(), "cancelling the context releases the watch")
}
