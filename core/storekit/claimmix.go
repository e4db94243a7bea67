package storekit

import "sync/atomic"

// ClaimMix is for a store whose claim of a new key has a cheaper form than
// its general claim (a bare insert tried first, as pgstore's and
// mysqlstore's claims do): an estimate of the share of
// recent claims that found their key existing (replays, in-flight
// duplicates, takeovers), an exponentially weighted average over about the
// last 32 claims. While that share is under Switch, InsertFirst says to
// try the cheap form first; above it the cheap form would too often find
// the key and cost a second statement, so the store claims the general way
// until the share falls back (a retry storm passes). Every claim, either
// way, reports what it found with Observe. The zero value is ready (insert
// first); safe for concurrent use.
type ClaimMix struct {
	// Switch is the share of existing keys, between 0 and 1, from which
	// the general claim goes first: where the cheap form plus, for that
	// share, the general claim costs more than the general claim alone
	// (measure both). Zero means a quarter.
	Switch float64

	existing atomic.Int64
}

const (
	mixOne   = 1 << 16 // 100 %, in fixed point
	mixShift = 5       // weight 1/32 per claim
)

// InsertFirst reports whether the next claim should try the cheap form.
func (m *ClaimMix) InsertFirst() bool {
	at := m.Switch
	if at <= 0 {
		at = 0.25
	}
	return m.Existing() < at
}

// Existing is the estimate itself, between 0 and 1: the share of recent
// claims that found their key existing (for a store whose switch moves
// with its load; InsertFirst compares it with Switch).
func (m *ClaimMix) Existing() float64 {
	return float64(m.existing.Load()) / mixOne
}

// Observe records whether a claim found its key existing.
func (m *ClaimMix) Observe(existed bool) {
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
