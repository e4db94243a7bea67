package core_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// wrapped is a store decorator in the shape otelidem's has.
type wrapped struct {
	core.Store
	inner core.Store
}

func (w wrapped) Unwrap() core.Store { return w.inner }

// cyclic unwraps to itself: StoreAs must give up, not hang.
type cyclic struct{ core.Store }

func (c *cyclic) Unwrap() core.Store { return c }

func TestStoreAs(t *testing.T) {
	ms := memstore.New()
	got, ok := storekit.As[*memstore.Store](ms)
	require.True(t, ok)
	assert.Same(t, ms, got)

	// Two decorators deep: found; the step capability is seen through them.
	deco := wrapped{Store: ms, inner: wrapped{Store: ms, inner: ms}}
	got, ok = storekit.As[*memstore.Store](deco)
	require.True(t, ok, "behind two decorators")
	assert.Same(t, ms, got)
	assert.True(t, core.StepsSupported(deco))

	// Not there: false, never a panic or a hang.
	_, ok = storekit.As[*memstore.Store](&cyclic{})
	assert.False(t, ok, "a decorator cycle")
	_, ok = storekit.As[storekit.Watcher](wrapped{Store: &cyclic{}, inner: &cyclic{}})
	assert.False(t, ok)
}
