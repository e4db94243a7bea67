package core_test

import (
	"testing"

	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storetest"
)

// BenchmarkWaitWake compares memstore waking the waiter (storekit.Watcher)
// with the same store polled (its Watcher hidden; default WithWaitPoll
// 20ms, doubling to 200ms); see storetest.BenchmarkWaitWake for what is
// measured and reported. Run with a fixed count, e.g. -benchtime 100x.
func BenchmarkWaitWake(b *testing.B) {
	b.Run("memstore/watch", func(b *testing.B) { storetest.BenchmarkWaitWake(b, memstore.New(), true) })
	b.Run("memstore/poll-20ms", func(b *testing.B) { storetest.BenchmarkWaitWake(b, memstore.New(), false) })
}
