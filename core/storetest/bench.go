package storetest

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// replayKeys is how many completed keys ClaimReplay cycles through, so that
// a parallel benchmark measures replays rather than contention on one row.
const replayKeys = 1024

// Benchmark measures a store's hot paths. newStore is the same constructor
// Run takes; it is called once per sub-benchmark run with that run's
// *testing.B. Sub-benchmarks, each reporting allocations:
//
//   - ClaimComplete/{Serial,Parallel}: claim a fresh key and complete it,
//     the cost of a first request.
//   - ClaimReplay/{Serial,Parallel}: claim a key that is already completed,
//     the cost of a retry answered from the store.
//
// Key names are formatted inside the loop and count toward allocations
// (one per operation).
func Benchmark(b *testing.B, newStore func(tb testing.TB) core.Store) {
	b.Run("ClaimComplete", func(b *testing.B) {
		b.Run("Serial", func(b *testing.B) {
			s, req := newStore(b), benchReq()
			ctx := b.Context()
			b.ReportAllocs()
			var i int64
			for b.Loop() {
				i++
				req.Key = "k" + strconv.FormatInt(i, 10)
				if err := claimComplete(ctx, s, req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("Parallel", func(b *testing.B) {
			s, base := newStore(b), benchReq()
			ctx := b.Context()
			var n atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := base
				for pb.Next() {
					req.Key = "k" + strconv.FormatInt(n.Add(1), 10)
					if err := claimComplete(ctx, s, req); err != nil {
						b.Error(err) // not Fatal: this is not the benchmark goroutine
						return
					}
				}
			})
		})
	})
	b.Run("ClaimReplay", func(b *testing.B) {
		b.Run("Serial", func(b *testing.B) {
			s, req := newStore(b), benchReq()
			ctx := b.Context()
			keys := completedKeys(b, s, req)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req.Key = keys[i%len(keys)]
				i++
				if err := replay(ctx, s, req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("Parallel", func(b *testing.B) {
			s, base := newStore(b), benchReq()
			ctx := b.Context()
			keys := completedKeys(b, s, base)
			var n atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := base
				for pb.Next() {
					req.Key = keys[int(n.Add(1))%len(keys)]
					if err := replay(ctx, s, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	})
}

func benchReq() storekit.ClaimRequest {
	req := newReq()
	req.Key = ""
	return req
}

var benchResponse = storekit.StoredResponse{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}},
	Body:   []byte(`{"id":"pay_1","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`),
}

func claimComplete(ctx context.Context, s core.Store, req storekit.ClaimRequest) error {
	res, err := s.Claim(ctx, req)
	if err != nil {
		return err
	}
	if !res.Claimed {
		return errNotClaimed(req.Key)
	}
	return s.Complete(ctx, fence(res.Record), benchResponse)
}

func replay(ctx context.Context, s core.Store, req storekit.ClaimRequest) error {
	res, err := s.Claim(ctx, req)
	if err != nil {
		return err
	}
	if res.Claimed || res.Record.Status != storekit.StatusCompleted {
		return errNotReplayed(req.Key)
	}
	return nil
}

// completedKeys completes replayKeys keys under req's scope and returns them.
func completedKeys(b *testing.B, s core.Store, req storekit.ClaimRequest) []string {
	b.Helper()
	keys := make([]string, replayKeys)
	for i := range keys {
		req.Key = "r" + strconv.Itoa(i)
		keys[i] = req.Key
		if err := claimComplete(b.Context(), s, req); err != nil {
			b.Fatal(err)
		}
	}
	return keys
}

type errNotClaimed string

func (e errNotClaimed) Error() string {
	return "storetest: fresh key " + string(e) + " was not claimed"
}

type errNotReplayed string

func (e errNotReplayed) Error() string {
	return "storetest: completed key " + string(e) + " was not replayed"
}
