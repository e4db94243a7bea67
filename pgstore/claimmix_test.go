package pgstore

import "testing"

// TestClaimMixSwitch: the share of existing keys past which claims call
// the function first is 25 % for claims that arrive alone and 50 % while
// claims crowd (their inserts then share statements).
func TestClaimMixSwitch(t *testing.T) {
	// settle feeds 200 claims in which existing keys have the given share
	// (per cent), each arriving alone or beside another in flight, and
	// reports whether the last one inserted first.
	settle := func(share int, crowded bool) bool {
		var m claimMix
		var first bool
		for i := range 200 {
			if crowded {
				m.inFlight.Add(1) // another claim in flight
			}
			first = m.start()
			m.observe(i%10 < share/10)
			m.done()
			if crowded {
				m.inFlight.Add(-1)
			}
		}
		return first
	}
	for _, c := range []struct {
		share   int
		crowded bool
		want    bool
	}{
		{0, false, true}, {10, false, true}, {40, false, false}, {90, false, false},
		{0, true, true}, {10, true, true}, {40, true, true}, {90, true, false},
	} {
		if got := settle(c.share, c.crowded); got != c.want {
			t.Errorf("%d %% existing keys, crowded %v: insert first %v, want %v", c.share, c.crowded, got, c.want)
		}
	}
}
