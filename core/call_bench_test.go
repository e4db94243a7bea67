package core_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/core"
)

// BenchmarkCall is Engine.Call's cost on memstore, to set beside
// BenchmarkDecideCommit/raw (first) and BenchmarkReplay (replay): the same
// payload as input and the same body as result.
func BenchmarkCall(b *testing.B) {
	result := benchResp.Body
	fn := func(context.Context) ([]byte, error) { return result, nil }
	ctx := context.Background()
	b.Run("first", func(b *testing.B) {
		keys := benchKeys(1 << 16)
		eng := benchEngine(b)
		i := 0
		cpuLoop(b, func() {
			if i == len(keys) {
				b.StopTimer()
				eng, i = benchEngine(b), 0
				b.StartTimer()
			}
			res, err := eng.Call(ctx, core.CallRequest{Scope: "u1", Key: keys[i], Name: "/v1/payments", Input: payBytes}, fn)
			i++
			if err != nil || res.Replayed {
				b.Fatalf("call: %+v %v", res, err)
			}
		})
	})
	b.Run("replay", func(b *testing.B) {
		eng := benchEngine(b)
		req := core.CallRequest{Scope: "u1", Key: "replayed-key", Name: "/v1/payments", Input: payBytes}
		if _, err := eng.Call(ctx, req, fn); err != nil {
			b.Fatal(err)
		}
		cpuLoop(b, func() {
			if res, err := eng.Call(ctx, req, fn); err != nil || !res.Replayed {
				b.Fatalf("call: %+v %v", res, err)
			}
		})
	})
}
