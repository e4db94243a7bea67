package model

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// memEnv is a fresh memstore on a clock the history drives: Lapse and
// Expire move it forward for every record at once.
func memEnv(wrap func(*memstore.Store) core.Store) *Env {
	var off atomic.Int64
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := memstore.New(memstore.WithClock(func() time.Time { return base.Add(time.Duration(off.Load())) }))
	var s core.Store = ms
	if wrap != nil {
		s = wrap(ms)
	}
	return &Env{
		Store:     s,
		Scope:     "tenant",
		LapseAll:  func() { off.Add(int64(Lease + time.Nanosecond)) },
		ExpireAll: func() { off.Add(int64(Retention + Lease + time.Nanosecond)) },
	}
}

func TestMemstore(t *testing.T) {
	t.Parallel()
	sum, fails := Run(context.Background(), config(t, 150), func(int) *Env { return memEnv(nil) })
	Report(t, "memstore", fails)
	covered(t, sum, false)
}
