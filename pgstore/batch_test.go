package pgstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestBatchLimitAdapts: statements that take no longer than the fastest
// of late (a database a round trip away) let every request go alone;
// statements that wait in the database (four times the fastest) bring the
// limit down to one in flight, so that requests share; and back. (Under a
// load that never lets up, the window forgets the unloaded round trip: the
// limit then rises again; BENCHMARKS.md §3 measures that case.)
func TestBatchLimitAdapts(t *testing.T) {
	var b batcher[*pendingClaim]
	b.start(0, rttTolerance)
	const rtt = 2 * time.Millisecond
	for range 1000 {
		b.adapt(rtt + 10*time.Microsecond)
	}
	assert.Equal(t, float64(limitMax), b.limit, "a round trip away, nobody queues")
	for range minWindowSize / 2 { // within the window that remembers rtt
		b.adapt(4 * rtt)
	}
	assert.Less(t, b.limit, 2.0, "statements waiting in the database: one in flight")
	for range 1000 {
		b.adapt(rtt)
	}
	assert.Equal(t, float64(limitMax), b.limit, "back to a round trip")

	b.start(1, rttTolerance)
	for range 100 {
		b.adapt(rtt)
	}
	assert.Equal(t, 1.0, b.limit, "a pinned limit does not move")
}

// TestBatchLimitIgnoresAnOccasionalSlowStatement: a database a round trip
// away, where one statement in twenty takes four round trips (a busy
// host, a checkpoint) and the rest a little over one. Statements are not
// waiting on each other, so nobody should queue; judging each statement on
// its own, every slow one cut the limit by a tenth, and it fell to 38 here
// (13–22 measured 2 ms away), so requests queued behind a round trip for
// nothing (BENCHMARKS.md §4).
func TestBatchLimitIgnoresAnOccasionalSlowStatement(t *testing.T) {
	var b batcher[*pendingClaim]
	b.start(0, rttTolerance)
	const rtt = 2 * time.Millisecond
	lowest := float64(limitMax)
	for i := range 2000 {
		took := rtt + rtt/2
		if i%20 == 19 {
			took = 4 * rtt
		}
		b.adapt(took)
		if i >= 1000 {
			lowest = min(lowest, b.limit)
		}
	}
	assert.Equal(t, float64(limitMax), lowest, "the limit stays where nobody queues")
}

// TestBatchLimitOfClaimCallsToleratesABusyHost: a database a round trip
// away on a busy host, where statements take a little over twice the
// fastest on average. The writes still share (each shared statement saves
// a commit); the claim function's calls, mostly replays that commit
// nothing, keep every request going alone: queued, a replay waited a whole
// statement for nothing (BENCHMARKS.md §4). A database whose CPU is the
// limit (five times the fastest) makes both share.
func TestBatchLimitOfClaimCallsToleratesABusyHost(t *testing.T) {
	var s Store
	s.initBatches()
	const rtt = 2 * time.Millisecond
	lowestCalls, lowestWrites := float64(limitMax), float64(limitMax)
	for i := range 2000 {
		took := rtt // alternately one round trip and 3.5: 2.25 on average
		if i%2 == 1 {
			took = rtt * 7 / 2
		}
		s.calls.adapt(took)
		s.writes.adapt(took)
		if i >= 1000 {
			lowestCalls, lowestWrites = min(lowestCalls, s.calls.limit), min(lowestWrites, s.writes.limit)
		}
	}
	assert.GreaterOrEqual(t, lowestCalls, 16.0, "claim calls: a request alone goes at once (16 clients)")
	assert.Less(t, lowestWrites, 16.0, "writes: requests share")

	for range minWindowSize / 2 { // within the window that remembers rtt
		s.calls.adapt(5 * rtt)
		s.writes.adapt(5 * rtt)
	}
	assert.Less(t, s.calls.limit, 2.0, "claim calls waiting in the database: one in flight")
	assert.Less(t, s.writes.limit, 2.0, "writes waiting in the database: one in flight")
}
