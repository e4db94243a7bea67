package sqlitestore

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
)

// TestConformance runs storetest, each sub-test on a database file of its
// own, with WithRetentionMargin(0), so that the suite's
// Incarnation/NewAfterSweep case sees Sweep delete its expired record (it
// fails otherwise). The margin is read by Sweep and Maintain only;
// TestSweepMargin checks that a record expired less than the margin ago is
// kept.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(tb testing.TB) core.Store { return newStore(tb, WithRetentionMargin(0)) })
}
