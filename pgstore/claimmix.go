package pgstore

import "sync/atomic"

// claimMix is WithInsertFirst's estimate of the share of recent claims
// that found their key existing (replays, in-flight duplicates, takeovers):
// an exponentially weighted average over about the last 32 claims, in
// fixed point (mixOne is 100 %). Above the switch the bare insert would
// mostly find the key and cost a second statement, so Claim calls the
// claim function directly until the share falls back (a retry storm
// passes). Every claim, either way, reports what it found.
//
// Where the switch lies depends on what an insert costs. Alone, about
// what the function costs: insert first below 25 % existing keys. While
// claims crowd (most arrive with another in flight), their inserts travel
// in shared statements (claimbatch.go) at a fraction of that cost, and
// inserting first pays up to 50 % existing keys (BENCHMARKS.md §4.000000).
type claimMix struct {
	existing atomic.Int64
	// crowded: the same average of claims that arrived while another
	// claim of the store was in flight; inFlight counts those claims.
	crowded  atomic.Int64
	inFlight atomic.Int64
}

const (
	mixOne         = 1 << 16
	mixShift       = 5          // weight 1/32 per claim
	mixSwitch      = mixOne / 4 // insert first below 25 % existing keys
	mixSwitchBatch = mixOne / 2 // while claims crowd: below 50 %
)

// start counts a claim in flight and reports whether the next claim
// should try the bare insert; the caller calls done when the claim is over.
func (m *claimMix) start() (insertFirst bool) {
	ewma(&m.crowded, m.inFlight.Add(1) > 1)
	return m.insertFirst()
}

// insertFirst reports whether the next claim should try the bare insert.
func (m *claimMix) insertFirst() bool {
	limit := int64(mixSwitch)
	if m.crowded.Load() > mixOne/2 {
		limit = mixSwitchBatch
	}
	return m.existing.Load() < limit
}

// done ends a claim counted by start.
func (m *claimMix) done() { m.inFlight.Add(-1) }

// observe records whether a claim found its key existing.
func (m *claimMix) observe(existed bool) { ewma(&m.existing, existed) }

// ewma moves the average v one step towards 100 % (yes) or 0.
func ewma(v *atomic.Int64, yes bool) {
	var x int64
	if yes {
		x = mixOne
	}
	for {
		old := v.Load()
		if v.CompareAndSwap(old, old+(x-old)>>mixShift) {
			return
		}
	}
}
