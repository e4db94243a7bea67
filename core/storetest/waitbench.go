package storetest

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
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
)

// BenchmarkWaitWake measures wait mode (core.WithWait) on s: one
// sub-benchmark's body, for callers that compare several stores or wait
// options side by side. Per operation, an owner claims a fresh key; a
// duplicate arrives while the owner runs, looks once (finds the key in
// flight), and waits; the owner commits after a random 1-100ms (fixed
// seed). The engine is built with core.WithWait(5s) followed by opts, so
// opts may override the wait or set core.WithWaitPoll.
//
// With watch, s must implement storekit.Watcher (the benchmark fails otherwise;
// a caller whose store may not should check and skip) and the waiter is
// woken by it; without, the Watcher is hidden and the waiter polls.
//
// Reported per operation: wake-µs, the time from the start of the owner's
// Commit to the moment the waiter's Decide returns with the replay (mean,
// plus wake-p50-µs and wake-p99-µs), and commit-µs, the Commit itself.
// ns/op is dominated by the simulated handler time and means nothing here.
// Run with a fixed count, e.g. -benchtime 100x. s is not emptied: keys are
// unique per call, so one store may serve several calls.
func BenchmarkWaitWake(b *testing.B, s core.Store, watch bool, opts ...core.Option) {
	ls := &lookStore{Store: s, looked: make(chan struct{}, 1)}
	var es core.Store = ls
	if watch {
		w, ok := s.(storekit.Watcher)
		if !ok {
			b.Fatalf("%T is not a storekit.Watcher", s)
		}
		es = watchLookStore{ls, w}
	}
	eng, err := core.New(es, append([]core.Option{core.WithWait(5 * time.Second)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := func(key string) core.Request {
		return core.Request{Method: http.MethodPost, Route: "/v1/payments", Scope: "u1",
			Header: http.Header{"Idempotency-Key": {key}}, Body: bytes.NewReader(waitBody)}
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
		<-ls.looked // the waiter found the key in flight (the signal, not a sleep)
		// Not synchronisation: the owner's handler time (1-100ms), during
		// which the duplicate waits; that wait is what the benchmark measures.
		time.Sleep(time.Millisecond + time.Duration(rng.Int64N(int64(99*time.Millisecond))))
		t0 := time.Now()
		if err := eng.Commit(hctx, d, waitResponse); err != nil {
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

// waitBody and waitResponse are the request body and the owner's response
// in BenchmarkWaitWake: a typical payment and its 201.
var (
	waitBody     = []byte(`{"amount":1000,"currency":"JPY","to":"alice"}`)
	waitResponse = adapterkit.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}},
		Body:   []byte(`{"id":"pay_1","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`),
	}
)

// lookStore signals every claim that did not claim: a waiter has looked
// and found the key in flight. It hides the inner store's storekit.Watcher.
type lookStore struct {
	core.Store
	looked chan struct{}
}

func (s *lookStore) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && !res.Claimed {
		select {
		case s.looked <- struct{}{}:
		default:
		}
	}
	return res, err
}

// watchLookStore is lookStore keeping the inner store's storekit.Watcher.
type watchLookStore struct {
	*lookStore
	w storekit.Watcher
}

func (s watchLookStore) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	return s.w.Watch(ctx, scope, key)
}

// reportLatencies reports the mean, p50 and p99 of ds in µs, as name-µs,
// name-p50-µs and name-p99-µs. It sorts ds.
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
