package pgstore

import "sync/atomic"

// claimMix is WithInsertFirst's estimate of the share of recent claims
// that found their key existing (replays, in-flight duplicates, takeovers):
// an exponentially weighted average over about the last 32 claims, in
// fixed point (mixOne is 100 %). Above mixSwitch the bare insert would
// mostly find the key and cost a second statement, so Claim calls the
// claim function directly until the share falls back (a retry storm
// passes). Every claim, either way, reports what it found.
type claimMix struct{ existing atomic.Int64 }

const (
	mixOne    = 1 << 16
	mixShift  = 5          // weight 1/32 per claim
	mixSwitch = mixOne / 4 // insert first below 25 % existing keys
)

// insertFirst reports whether the next claim should try the bare insert.
func (m *claimMix) insertFirst() bool { return m.existing.Load() < mixSwitch }

// observe records whether a claim found its key existing.
func (m *claimMix) observe(existed bool) {
	var x int64
	if existed {
		x = mixOne
	}
	for {
		v := m.existing.Load()
		if m.existing.CompareAndSwap(v, v+(x-v)>>mixShift) {
			return
		}
	}
}
