package pgstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// BenchmarkWaitWake measures how soon a waiting duplicate replays after the
// owner commits: polled at the default interval (20ms, doubling to 200ms),
// polled at 5ms, and woken by the store when it implements storekit.Watcher
// (skipped otherwise); see storetest.BenchmarkWaitWake for what is measured
// and reported. Run with a fixed count, e.g. -benchtime 100x.
func BenchmarkWaitWake(b *testing.B) {
	cfg := pgstoretest.Config(b)
	cfg.MaxConns = 8
	pool := pgstoretest.NewPool(b, cfg)
	s := newStore(b, pool)
	b.Run("poll-20ms", func(b *testing.B) { storetest.BenchmarkWaitWake(b, s, false) })
	b.Run("poll-5ms", func(b *testing.B) {
		storetest.BenchmarkWaitWake(b, s, false, core.WithWaitPoll(5*time.Millisecond))
	})
	b.Run("watch", func(b *testing.B) {
		if _, ok := core.Store(s).(storekit.Watcher); !ok {
			b.Skipf("%T is not a storekit.Watcher", s)
		}
		storetest.BenchmarkWaitWake(b, s, true)
	})
}
