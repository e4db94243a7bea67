package pgstore

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// BenchmarkStep measures what a recovery point costs a first execution:
// through the engine on pgstore (plain mode), Decide + Commit of a fresh
// key ("plain") against the same with one core.Step ("step", one fenced
// insert) and two ("steps2"). The variants alternate in rounds (as
// BenchmarkFloor's do) and the reported ratios are medians over rounds of
// throughput relative to "plain" in the same round; "µs/step" is the median
// extra time per execution of "step" over "plain" at one worker. Use a
// fixed count, e.g. -benchtime 2000x.
func BenchmarkStep(b *testing.B) {
	for _, workers := range []int{1, 16} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			cfg := pgstoretest.Config(b)
			cfg.MaxConns = int32(workers)
			cfg.MinConns = int32(workers)
			pool := pgstoretest.NewPool(b, cfg)
			s := newStore(b, pool)
			eng, err := core.New(s, core.WithStepsRequired(true), core.WithSharedKeySpace())
			if err != nil {
				b.Fatal(err)
			}
			body := []byte(`{"amount":1000,"currency":"JPY","to":"alice"}`)
			resp := adapterkit.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
				Body: []byte(`{"id":"pay_123","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`)}
			charge := func(context.Context) ([]byte, error) { return []byte(`{"id":"ch_0123456789abcdef"}`), nil }
			execute := func(steps int) pairFunc {
				return func(ctx context.Context, key string) error {
					d, err := eng.Decide(ctx, core.Request{Method: http.MethodPost, Route: "/v1/payments", Target: "/v1/payments",
						Header: http.Header{"Idempotency-Key": {key}}, Body: strings.NewReader(string(body))})
					if err != nil {
						return err
					}
					if d.Outcome != core.Proceed {
						return fmt.Errorf("decide: %v", d.Outcome)
					}
					hctx := d.Context(ctx)
					for i := range steps {
						if _, err := core.Step(hctx, "step-"+strconv.Itoa(i), charge); err != nil {
							_ = eng.Abort(ctx, d, err)
							return err
						}
					}
					return eng.Commit(ctx, d, resp)
				}
			}
			variants := []floorVariant{{"plain", execute(0)}, {"step", execute(1)}, {"steps2", execute(2)}}
			ratios := make([][]float64, len(variants))
			var extra []float64 // µs per execution, step over plain
			took := make([]time.Duration, len(variants))
			total := make([]time.Duration, len(variants))
			round := max(8*workers, 100)
			keys := newKeySource(true, "s"+strconv.FormatInt(time.Now().UnixNano(), 36)+"-")
			n := 0
			alternate(b, workers, round, keys, variants, func(i int, run func()) {
				t0 := time.Now()
				run()
				took[i] = time.Since(t0)
				total[i] += took[i]
			}, func() {
				n = min(round, b.N)
				for i := range variants[1:] {
					ratios[i+1] = append(ratios[i+1], took[0].Seconds()/took[i+1].Seconds())
				}
				extra = append(extra, float64((took[1]-took[0]).Microseconds())*float64(workers)/float64(n))
			})
			b.StopTimer()
			median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
			for i, v := range variants {
				if i > 0 {
					b.ReportMetric(median(ratios[i]), v.name+"/plain")
				}
				b.ReportMetric(float64(b.N)/total[i].Seconds(), v.name+"-exec/s")
			}
			b.ReportMetric(median(extra), "µs/step")
		})
	}
}
