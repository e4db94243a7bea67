package sqlitestore

import (
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
)

// TestConformance runs storetest, each sub-test on a database file of its
// own: as New configures the store, and with no retention margin (so the
// suite's after-Sweep case runs instead of skipping).
func TestConformance(t *testing.T) {
	for _, v := range []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"margin0", []Option{WithRetentionMargin(0)}},
	} {
		t.Run(v.name, func(t *testing.T) {
			storetest.Run(t, func(tb testing.TB) core.Store { return newStore(tb, v.opts...) })
		})
	}
}
