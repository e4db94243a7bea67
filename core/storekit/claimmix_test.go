package storekit_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/core/storekit"
)

// observe reports n claims, every k-th of which found its key existing.
func observe(m *storekit.ClaimMix, n, k int) {
	for i := range n {
		m.Observe(i%k == 0)
	}
}

func TestClaimMixZeroValueInsertsFirst(t *testing.T) {
	var m storekit.ClaimMix
	assert.True(t, m.InsertFirst())
}

func TestClaimMixSwitchesDuringARetryStormAndBack(t *testing.T) {
	var m storekit.ClaimMix
	n := 0
	for ; n < 100 && m.InsertFirst(); n++ {
		m.Observe(true)
	}
	assert.False(t, m.InsertFirst(), "still inserting first after %d existing keys", n)
	assert.LessOrEqual(t, n, 16, "a quarter is reached within a few claims of a storm")
	for n = 0; n < 1000 && !m.InsertFirst(); n++ {
		m.Observe(false)
	}
	assert.True(t, m.InsertFirst(), "the storm passed, yet the general claim still goes first")
}

func TestClaimMixSwitchIsTheShareOfExistingKeys(t *testing.T) {
	quarter, half := storekit.ClaimMix{}, storekit.ClaimMix{Switch: 0.5}
	observe(&quarter, 1000, 3) // a third existing
	observe(&half, 1000, 3)
	assert.False(t, quarter.InsertFirst(), "a third of keys existing is over the default quarter")
	assert.True(t, half.InsertFirst(), "a third of keys existing is under a half")
	observe(&half, 1000, 1) // all existing
	assert.False(t, half.InsertFirst())
}

func TestClaimMixExistingIsTheEstimate(t *testing.T) {
	var m storekit.ClaimMix
	assert.Zero(t, m.Existing())
	observe(&m, 1000, 3) // a third existing
	assert.InDelta(t, 1.0/3, m.Existing(), 0.1)
	observe(&m, 1000, 1)
	assert.InDelta(t, 1, m.Existing(), 0.01)
}
