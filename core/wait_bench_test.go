package core_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// lookStore signals every claim that did not claim: a waiter has looked
// and found the key in flight.
type lookStore struct {
	core.Store
	looked chan struct{}
}

func (s *lookStore) Claim(ctx context.Context, req core.ClaimRequest) (core.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && !res.Claimed {
		select {
		case s.looked <- struct{}{}:
		default:
		}
	}
	return res, err
}

// watchLookStore is lookStore keeping the inner store's core.Watcher.
type watchLookStore struct {
	*lookStore
	w core.Watcher
}

func (s watchLookStore) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	return s.w.Watch(ctx, scope, key)
}

// benchWaitWake measures wait mode (core.WithWait): a duplicate arrives
// while the owner runs, looks once (409 territory), and waits; the owner
// commits after a random 1-100ms (fixed seed). Reported per operation:
// wake-µs, the time from the start of the owner's Commit to the moment the
// waiter's Decide returns with the replay (mean, p50, p99), and commit-µs,
// the Commit itself. ns/op is dominated by the simulated handler time and
// means nothing here.
func benchWaitWake(b *testing.B, store core.Store, watch bool, opts ...core.Option) {
	ls := &lookStore{Store: store, looked: make(chan struct{}, 1)}
	var s core.Store = ls
	if watch {
		w, ok := store.(core.Watcher)
		if !ok {
			b.Fatalf("%T is not a core.Watcher", store)
		}
		s = watchLookStore{ls, w}
	}
	eng, err := core.New(s, append([]core.Option{core.WithWait(5 * time.Second)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := func(key string) core.Request {
		return core.Request{Method: http.MethodPost, Route: "/v1/payments", Scope: "u1",
			Header: http.Header{"Idempotency-Key": {key}}, Body: bytes.NewReader(payBytes)}
	}
	type result struct {
		at  time.Time
		d   *core.Decision
		err error
	}
	rng := rand.New(rand.NewPCG(1, 2))
	prefix := "wait-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	wakes := make([]time.Duration, 0, b.N)
	var commits time.Duration
	b.ResetTimer()
	for i := range b.N {
		key := prefix + strconv.Itoa(i)
		d, err := eng.Decide(ctx, req(key))
		if err != nil || d.Outcome != core.Proceed {
			b.Fatalf("owner: %v %v", d.Outcome, err)
		}
		hctx := d.Context(ctx)
		select { // drain a stale signal
		case <-ls.looked:
		default:
		}
		done := make(chan result, 1)
		go func() {
			d, err := eng.Decide(ctx, req(key))
			done <- result{time.Now(), d, err}
		}()
		<-ls.looked
		time.Sleep(time.Millisecond + time.Duration(rng.Int64N(int64(99*time.Millisecond))))
		t0 := time.Now()
		if err := eng.Commit(hctx, d, benchResp); err != nil {
			b.Fatal(err)
		}
		commits += time.Since(t0)
		r := <-done
		if r.err != nil || r.d.Outcome != core.Replay {
			b.Fatalf("waiter: %v %v", r.d.Outcome, r.err)
		}
		wakes = append(wakes, r.at.Sub(t0))
	}
	b.StopTimer()
	reportLatencies(b, "wake", wakes)
	b.ReportMetric(float64(commits.Microseconds())/float64(b.N), "commit-µs")
}

// reportLatencies reports the mean, p50 and p99 of ds in µs.
func reportLatencies(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportMetric(us(sum)/float64(len(ds)), name+"-µs")
	b.ReportMetric(us(ds[len(ds)/2]), name+"-p50-µs")
	b.ReportMetric(us(ds[min(len(ds)-1, len(ds)*99/100)]), name+"-p99-µs")
}

// BenchmarkWaitWake compares memstore waking the waiter (core.Watcher)
// with the same store polled (its Watcher hidden; default WithWaitPoll
// 20ms, doubling to 200ms). Run with a fixed count, e.g. -benchtime 100x.
func BenchmarkWaitWake(b *testing.B) {
	b.Run("memstore/watch", func(b *testing.B) { benchWaitWake(b, memstore.New(), true) })
	b.Run("memstore/poll-20ms", func(b *testing.B) { benchWaitWake(b, memstore.New(), false) })
}
