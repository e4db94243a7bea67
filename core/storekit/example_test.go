package storekit_test

import (
	"fmt"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// metered is a store decorator (metrics, tracing): Unwrap exposes the
// store it wraps, so capabilities stay visible through it.
type metered struct{ core.Store }

func (m metered) Unwrap() storekit.Store { return m.Store }

// As finds a capability behind decorators, as the engine does for
// StepStore and Watcher.
func ExampleAs() {
	var s core.Store = metered{memstore.New()}
	_, direct := s.(storekit.StepStore)
	_, found := storekit.As[storekit.StepStore](s)
	fmt.Println(direct, found)
	// Output: false true
}
