package pgstore

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
	"github.com/idemkit/idem/pgstore/pgtest"
)

// waitLookStore signals every claim that did not claim: a waiter looked
// and found the key in flight. It hides the inner store's core.Watcher.
type waitLookStore struct {
	core.Store
	looked chan struct{}
}

func (s *waitLookStore) Claim(ctx context.Context, req core.ClaimRequest) (core.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && !res.Claimed {
		select {
		case s.looked <- struct{}{}:
		default:
		}
	}
	return res, err
}

// waitLookWatcher is waitLookStore keeping the inner store's core.Watcher.
type waitLookWatcher struct {
	*waitLookStore
	w core.Watcher
}

func (s waitLookWatcher) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	return s.w.Watch(ctx, scope, key)
}

var waitBenchResp = core.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"pay_1","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`),
}

// benchWaitWake is core's wait-mode benchmark on a pgstore: a duplicate
// arrives while the owner runs, looks once, and waits (core.WithWait); the
// owner commits after a random 1-100ms (fixed seed). Reported: wake-µs
// (mean, p50, p99), from the start of the owner's Commit to the waiter's
// Decide returning the replay, and commit-µs, the Commit itself. ns/op is
// the simulated handler time and means nothing here.
func benchWaitWake(b *testing.B, store core.Store, watch bool, opts ...core.Option) {
	ls := &waitLookStore{Store: store, looked: make(chan struct{}, 1)}
	var s core.Store = ls
	if watch {
		w, ok := store.(core.Watcher)
		if !ok {
			b.Skipf("%T is not a core.Watcher", store)
		}
		s = waitLookWatcher{ls, w}
	}
	eng, err := core.New(s, append([]core.Option{core.WithWait(5 * time.Second)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	body := []byte(`{"amount":1000,"currency":"JPY","to":"alice"}`)
	req := func(key string) core.Request {
		return core.Request{Method: http.MethodPost, Route: "/v1/payments", Scope: "u1",
			Header: http.Header{"Idempotency-Key": {key}}, Body: bytes.NewReader(body)}
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
		select {
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
		if err := eng.Commit(hctx, d, waitBenchResp); err != nil {
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
	slices.Sort(wakes)
	var sum time.Duration
	for _, w := range wakes {
		sum += w
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportMetric(us(sum)/float64(len(wakes)), "wake-µs")
	b.ReportMetric(us(wakes[len(wakes)/2]), "wake-p50-µs")
	b.ReportMetric(us(wakes[min(len(wakes)-1, len(wakes)*99/100)]), "wake-p99-µs")
	b.ReportMetric(float64(commits.Microseconds())/float64(b.N), "commit-µs")
}

// BenchmarkWaitWake measures how soon a waiting duplicate replays after the
// owner commits: polled at the default interval (20ms, doubling to 200ms),
// polled at 5ms, and woken by the store when it implements core.Watcher.
// Run with a fixed count, e.g. -benchtime 100x.
func BenchmarkWaitWake(b *testing.B) {
	cfg := pgtest.Config(b)
	cfg.MaxConns = 8
	pool := pgtest.NewPool(b, cfg)
	s := newStore(b, pool)
	b.Run("poll-20ms", func(b *testing.B) { benchWaitWake(b, s, false) })
	b.Run("poll-5ms", func(b *testing.B) { benchWaitWake(b, s, false, core.WithWaitPoll(5*time.Millisecond)) })
	b.Run("watch", func(b *testing.B) { benchWaitWake(b, core.Store(s), true) })
}
