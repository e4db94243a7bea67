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
	b.start(0)
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

	b.start(1)
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
	b.start(0)
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
