// Package completer_test runs core/completer against every database store
// with Engine.Call: executions whose owner died after a step and were never
// retried are finished once, by one of two instances, and a call no
// completer registered is left alone.
package completer_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/completer"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/sqlitestore"
	"github.com/idemkit/idem/tests/internal/mystores"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

const lease = 200 * time.Millisecond

func TestCompleterFinishesOrphanedCalls(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) core.Store{
		"postgres": func(t *testing.T) core.Store { s, _ := pgstores.Store(t); return s },
		"mysql":    func(t *testing.T) core.Store { return mystores.Store(t) },
		"sqlite": func(t *testing.T) core.Store {
			db, err := sqlitestore.OpenDB(t.Context(), filepath.Join(t.TempDir(), "idem.db"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			require.NoError(t, sqlitestore.Migrate(t.Context(), db))
			s, err := sqlitestore.New(db)
			require.NoError(t, err)
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			checkOrphanedCalls(t, open(t))
		})
	}
}

// ledger counts provider charges and bookings per key, across instances.
type ledger struct {
	mu               sync.Mutex
	charges, booked  map[string]int
	refundsAttempted int
}

func (l *ledger) add(m map[string]int, key string) {
	l.mu.Lock()
	m[key]++
	l.mu.Unlock()
}

// pay is the registered operation: the charge is a step, the booking
// follows.
func (l *ledger) pay(ctx context.Context, input []byte) ([]byte, error) {
	key, _ := core.KeyFromContext(ctx)
	ch, err := core.Step(ctx, "charge", func(context.Context) ([]byte, error) {
		l.add(l.charges, key)
		return []byte("ch_" + key), nil
	})
	if err != nil {
		return nil, err
	}
	l.add(l.booked, key)
	return append(ch, input...), nil
}

func checkOrphanedCalls(t *testing.T, store core.Store) {
	l := &ledger{charges: map[string]int{}, booked: map[string]int{}}
	// The dying instances' lease is short (the test waits for it to
	// lapse); the completing ones keep the default, which no loaded host
	// lets lapse while they finish a record.
	newEngine := func(s core.Store, opts ...core.Option) *core.Engine {
		eng, err := core.New(s, opts...)
		require.NoError(t, err)
		return eng
	}
	// orphan runs one call on an instance that is killed after the charge.
	orphan := func(name, key string, register bool) {
		d := storetest.NewDying(store)
		eng := newEngine(d, core.WithLease(lease))
		if register {
			_, err := completer.New(eng, completer.Call("pay", l.pay))
			require.NoError(t, err)
		}
		_, err := eng.Call(t.Context(), core.CallRequest{Scope: "shop", Key: key, Name: name, Input: []byte(key)},
			func(ctx context.Context) ([]byte, error) {
				if _, err := core.Step(ctx, "charge", func(context.Context) ([]byte, error) {
					l.add(l.charges, key)
					return []byte("ch_" + key), nil
				}); err != nil {
					return nil, err
				}
				d.Kill()
				return nil, storetest.ErrKilled
			})
		require.Error(t, err)
	}
	const n = 4
	for i := range n {
		orphan("pay", fmt.Sprint("pay-", i), true)
	}
	orphan("refund", "refund-0", false) // no completer registered it

	var cs []*completer.Completer
	for range 2 {
		c, err := completer.New(newEngine(store), completer.WithAfter(0),
			completer.Call("pay", l.pay),
			completer.Call("refund", func(context.Context, []byte) ([]byte, error) {
				l.mu.Lock()
				l.refundsAttempted++
				l.mu.Unlock()
				return nil, nil
			}))
		require.NoError(t, err)
		cs = append(cs, c)
	}
	lister, ok := storekit.As[interface {
		Stuck(context.Context, int) ([]storekit.AdminRecord, error)
	}](store)
	require.True(t, ok)
	require.Eventually(t, func() bool {
		stuck, err := lister.Stuck(t.Context(), 100)
		return err == nil && len(stuck) == n+1
	}, 10*time.Second, 20*time.Millisecond, "the dead owners' leases lapse")

	reps := make([]completer.Report, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			var err error
			if reps[i], err = c.Once(t.Context()); err != nil {
				t.Errorf("completer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, n, reps[0].Finished+reps[1].Finished, "every orphan finished once: %+v", reps)
	assert.Zero(t, reps[0].Failed+reps[1].Failed, "%+v", reps)

	eng := newEngine(store)
	for i := range n {
		key := fmt.Sprint("pay-", i)
		assert.Equal(t, 1, l.charges[key], "%s charged once", key)
		assert.Equal(t, 1, l.booked[key], "%s booked once", key)
		res, err := eng.Call(t.Context(), core.CallRequest{Scope: "shop", Key: key, Name: "pay", Input: []byte(key)},
			func(context.Context) ([]byte, error) {
				t.Errorf("%s: the late retry ran the call again", key)
				return nil, nil
			})
		require.NoError(t, err)
		assert.True(t, res.Replayed, key)
		assert.Equal(t, "ch_"+key+key, string(res.Value))
	}
	rec, err := store.Get(t.Context(), "shop", "refund-0")
	require.NoError(t, err)
	assert.Equal(t, storekit.StatusProcessing, rec.Status, "the unregistered call is left to its client")
	assert.Zero(t, l.refundsAttempted, "its request was never kept, so nothing re-ran it")
}
