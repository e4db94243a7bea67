package core_test

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
)

// The engine's cost per request on memstore, without any HTTP framework:
// what every adapter pays on top of its own translation work. The request
// carries the headers a real client sends; the response is a typical 201.

var (
	payBytes       = []byte(payBody)
	benchReqHeader = http.Header{
		"Host":            {"api.example.com"},
		"User-Agent":      {"bench/1.0"},
		"Content-Type":    {"application/json"},
		"Content-Length":  {strconv.Itoa(len(payBody))},
		"Idempotency-Key": {""}, // set per request
		"X-User-Id":       {"u1"},
	}
	benchResp = adapterkit.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/v1/payments/pay_1"},
			"Set-Cookie":   {"session=abc"}, // dropped by the allow-list
		},
		Body: []byte(`{"id":"pay_1","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`),
	}
)

// benchRequest returns a request with key and a fresh body reader, reusing
// one header map (Decide only reads it).
func benchRequest(h http.Header, body *bytes.Reader) core.Request {
	body.Reset(payBytes)
	return core.Request{Method: http.MethodPost, Route: "/v1/payments", Header: h, Body: body, Scope: "u1"}
}

func benchEngine(b *testing.B, opts ...core.Option) *core.Engine {
	b.Helper()
	eng, err := core.New(memstore.New(), append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	return eng
}

// cpuLoop runs op b.Loop() times with allocations reported and adds the
// process CPU time per operation (cpu-ns/op), which other load on the
// machine disturbs much less than wall time.
func cpuLoop(b *testing.B, op func()) {
	b.ReportAllocs()
	start := processCPU()
	n := 0
	for b.Loop() {
		op()
		n++
	}
	if end := processCPU(); start >= 0 && end >= 0 && n > 0 {
		b.ReportMetric(float64(end-start)/float64(n), "cpu-ns/op")
	}
}

// benchKeys returns n distinct UUID-shaped keys, made outside the timer.
func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = strconv.FormatInt(int64(i), 16) + "-0000-4000-8000-000000000000"
	}
	return keys
}

// BenchmarkDecideCommit is a first execution: Decide claims a fresh key,
// the handler's context is derived (lease, heartbeat goroutine), and Commit
// stores the response. Every 1<<16 keys the store is replaced outside the
// timer so that map growth does not dominate.
func BenchmarkDecideCommit(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []core.Option
	}{
		{"raw", nil},
		{"canonical-json", []core.Option{core.WithCanonicalJSON(true)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			keys := benchKeys(1 << 16)
			eng := benchEngine(b, c.opts...)
			h := benchReqHeader.Clone()
			var body bytes.Reader
			ctx := context.Background()
			i := 0
			cpuLoop(b, func() {
				if i == len(keys) {
					b.StopTimer()
					eng, i = benchEngine(b, c.opts...), 0
					b.StartTimer()
				}
				h["Idempotency-Key"][0] = keys[i]
				i++
				d, err := eng.Decide(ctx, benchRequest(h, &body))
				if err != nil || d.Outcome != core.Proceed {
					b.Fatalf("decide: %v %v", d.Outcome, err)
				}
				hctx := d.Context(ctx)
				if err := eng.Commit(hctx, d, benchResp); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkReplay is a retry of a completed request: Decide reads the
// record and builds the replayed response. Its allocations are the bound
// stated in BENCHMARKS.md.
func BenchmarkReplay(b *testing.B) {
	eng := benchEngine(b)
	h := benchReqHeader.Clone()
	h["Idempotency-Key"][0] = "replayed-key"
	var body bytes.Reader
	ctx := context.Background()
	d, err := eng.Decide(ctx, benchRequest(h, &body))
	if err != nil || d.Outcome != core.Proceed {
		b.Fatalf("decide: %v %v", d.Outcome, err)
	}
	if err := eng.Commit(d.Context(ctx), d, benchResp); err != nil {
		b.Fatal(err)
	}
	cpuLoop(b, func() {
		d, err := eng.Decide(ctx, benchRequest(h, &body))
		if err != nil || d.Outcome != core.Replay {
			b.Fatalf("decide: %v %v", d.Outcome, err)
		}
	})
}

// BenchmarkFingerprint hashes the identity of a request: the typical
// payment body, and a 64 KiB one (the cost is then the SHA-256 itself).
func BenchmarkFingerprint(b *testing.B) {
	big := []byte(`{"items":[` + strings.Repeat(`{"sku":"a-1","qty":1},`, 64<<10/22) + `{}]}`)
	for _, c := range []struct {
		name  string
		body  []byte
		canon bool
	}{
		{"small/raw", []byte(payBody), false},
		{"small/canonical-json", []byte(payBody), true},
		{"64KiB/raw", big, false},
		{"64KiB/canonical-json", big, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			in := core.FingerprintInput{Method: "POST", Route: "/v1/payments", Body: c.body, CanonicalJSON: c.canon}
			b.SetBytes(int64(len(c.body)))
			cpuLoop(b, func() { _ = core.Fingerprint(in) })
		})
	}
}
