package otelidem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/otelidem"
)

// The sentinel is in every key and in the scope: it must appear in no
// exported attribute, event or status unless WithScopeAttribute asks for
// the scope.
const sentinel = "S3NT1NEL"

type rig struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	tel    *otelidem.Telemetry
	mem    *memstore.Store
	store  core.Store
}

func newRig(t *testing.T, opts ...otelidem.Option) *rig {
	t.Helper()
	r := &rig{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder(), mem: memstore.New()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = r.tp.Shutdown(context.Background()) })
	tel, err := otelidem.New(append([]otelidem.Option{otelidem.WithMeterProvider(mp), otelidem.WithTracerProvider(r.tp), nil}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.tel, r.store = tel, tel.Store(r.mem)
	return r
}

func (r *rig) engine(t *testing.T, opts ...core.Option) *core.Engine {
	t.Helper()
	eng, err := core.New(r.store, append([]core.Option{
		core.WithObserver(r.tel.Observer()),
		core.WithScope(func(context.Context, *core.Request) (string, error) { return "tenant-" + sentinel, nil }),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

func req(key, body string) core.Request {
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return core.Request{Method: "POST", Route: "/pay", Target: "/pay", Header: h, Body: strings.NewReader(body)}
}

// points flattens every exported data point: metric name, attributes, value
// (sum value or histogram count).
type point struct {
	name  string
	attrs attribute.Set
	value int64
}

func (r *rig) collect(t *testing.T) []point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []point
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelidem.ScopeName {
			t.Errorf("instrumentation scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{m.Name, dp.Attributes, dp.Value})
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{m.Name, dp.Attributes, int64(dp.Count)})
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// sum adds the values of name's points whose attributes include want.
func sum(points []point, name string, want ...attribute.KeyValue) int64 {
	var n int64
outer:
	for _, p := range points {
		if p.name != name {
			continue
		}
		for _, kv := range want {
			if v, ok := p.attrs.Value(kv.Key); !ok || v != kv.Value {
				continue outer
			}
		}
		n += p.value
	}
	return n
}

func outcome(s string) attribute.KeyValue { return attribute.String("idem.outcome", s) }

func TestMetricsAndSpans(t *testing.T) {
	r := newRig(t)
	eng := r.engine(t, core.WithLease(time.Second))
	waiting := r.engine(t, core.WithWait(5*time.Second), core.WithWaitPoll(10*time.Millisecond))

	// A request span, parent of every store span of the request.
	ctx, parent := r.tp.Tracer("test").Start(context.Background(), "request")
	d, err := eng.Decide(ctx, req("k1-"+sentinel, "a"))
	if err != nil || d.Outcome != core.Proceed {
		t.Fatalf("claim: %v %v", err, d.Outcome)
	}
	if err := eng.Commit(d.Context(ctx), d, adapterkit.Response{Status: 201, Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	mustOutcome := func(want core.Outcome, eng *core.Engine, ctx context.Context, rq core.Request) *core.Decision {
		t.Helper()
		d, err := eng.Decide(ctx, rq)
		if err != nil || d.Outcome != want {
			t.Fatalf("decide: %v %v, want %v", err, d.Outcome, want)
		}
		return d
	}
	mustOutcome(core.Replay, eng, context.Background(), req("k1-"+sentinel, "a"))
	mustOutcome(core.Reject, eng, context.Background(), req("k1-"+sentinel, "b"))    // mismatch
	mustOutcome(core.Reject, eng, context.Background(), req("", "a"))                // missing key
	mustOutcome(core.Bypass, eng, context.Background(), core.Request{Method: "GET"}) // bypass

	// In flight: a conflict, then a duplicate that waits and gets the replay.
	owner := mustOutcome(core.Proceed, eng, context.Background(), req("k2-"+sentinel, "a"))
	mustOutcome(core.Reject, eng, context.Background(), req("k2-"+sentinel, "a")) // 409
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	replayed := make(chan core.Outcome, 1)
	go func() {
		d, err := waiting.Decide(wctx, req("k2-"+sentinel, "a"))
		if err != nil {
			t.Errorf("waiting duplicate: %v", err)
		}
		replayed <- d.Outcome
	}()
	// Commit once the duplicate is waiting (a loaded machine may take a while).
	for start := time.Now(); sum(r.collect(t), "idem.waits") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the duplicate never started waiting")
		}
	}
	if err := eng.Commit(context.Background(), owner, adapterkit.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if o := <-replayed; o != core.Replay {
		t.Errorf("waiting duplicate: %v, want replay", o)
	}

	// A lost lease: the record is released under the owner (as idemctl
	// release would), so its commit is fenced out.
	lost := mustOutcome(core.Proceed, eng, context.Background(), req("k3-"+sentinel, "a"))
	lease, _ := storekit.LeaseFromContext(lost.Context(context.Background()))
	if err := r.mem.Fail(context.Background(), lease.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := eng.Commit(context.Background(), lost, adapterkit.Response{Status: 201}); !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("commit after release: %v, want ErrLeaseLost", err)
	}

	points := r.collect(t)
	for _, c := range []struct {
		name string
		kv   []attribute.KeyValue
		want int64
	}{
		{"idem.decisions", []attribute.KeyValue{outcome("claim"), attribute.String("http.route", "/pay")}, 3},
		{"idem.decisions", []attribute.KeyValue{outcome("replay"), attribute.Int("http.response.status_code", 201)}, 1},
		{"idem.decisions", []attribute.KeyValue{outcome("replay"), attribute.Int("http.response.status_code", 200)}, 1},
		{"idem.decisions", []attribute.KeyValue{outcome("mismatch")}, 1},
		{"idem.decisions", []attribute.KeyValue{outcome("conflict")}, 1},
		{"idem.decisions", []attribute.KeyValue{outcome("rejected"), attribute.Int("http.response.status_code", 400)}, 1},
		{"idem.decisions", []attribute.KeyValue{outcome("bypass")}, 1},
		{"idem.commits", []attribute.KeyValue{outcome("commit")}, 2},
		{"idem.commits", []attribute.KeyValue{outcome("lease_lost")}, 1},
		{"idem.lease.lost", nil, 1},
		{"idem.waits", nil, 1},
		{"idem.wait.duration", []attribute.KeyValue{attribute.String("idem.claim.outcome", "replay")}, 1},
		{"idem.store.duration", []attribute.KeyValue{attribute.String("idem.phase", "decide")}, 7},
		{"idem.store.duration", []attribute.KeyValue{attribute.String("idem.phase", "commit")}, 3},
	} {
		if got := sum(points, c.name, c.kv...); got != c.want {
			t.Errorf("%s %v = %d, want %d", c.name, c.kv, got, c.want)
		}
	}

	spans := r.spans.Ended()
	byName := map[string]int{}
	claimOutcomes := map[string]int{}
	var underParent int
	for _, s := range spans {
		byName[s.Name()]++
		if s.Parent().SpanID() == parent.SpanContext().SpanID() {
			underParent++
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "idem.claim.outcome" && s.Name() == "idem.claim" {
				claimOutcomes[kv.Value.AsString()]++
			}
		}
	}
	if underParent != 2 { // the first request's claim and complete
		t.Errorf("%d spans under the request span, want 2 (claim, complete)", underParent)
	}
	if byName["idem.complete"] != 3 || byName["idem.wait"] != 1 || byName["idem.claim"] < 7 {
		t.Errorf("spans: %v", byName)
	}
	for _, o := range []string{"claimed", "replay", "mismatch", "in_flight"} {
		if claimOutcomes[o] == 0 {
			t.Errorf("no idem.claim span with outcome %s: %v", o, claimOutcomes)
		}
	}
	var fencedOut bool
	for _, s := range spans {
		if s.Name() == "idem.complete" && s.Status().Code.String() == "Error" {
			for _, kv := range s.Attributes() {
				fencedOut = fencedOut || (kv.Key == "idem.fenced_out" && kv.Value.AsBool())
			}
		}
	}
	if !fencedOut {
		t.Error("the fenced-out commit's span does not say so")
	}
	checkNoSentinel(t, points, spans, false)
}

// checkNoSentinel fails if any exported string holds the sentinel (the
// scope's, when scopeAllowed, excepted under idem.scope).
func checkNoSentinel(t *testing.T, points []point, spans []sdktrace.ReadOnlySpan, scopeAllowed bool) {
	t.Helper()
	leaks := func(s string) bool {
		if scopeAllowed {
			s = strings.ReplaceAll(s, "tenant-"+sentinel, "")
		}
		return strings.Contains(s, sentinel)
	}
	check := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			if scopeAllowed && kv.Key == "idem.scope" {
				if strings.Contains(kv.Value.String(), "k1-") {
					t.Errorf("%s: a key in idem.scope", where)
				}
				continue
			}
			if leaks(string(kv.Key) + "=" + kv.Value.String()) {
				t.Errorf("%s: attribute %s=%s carries the sentinel", where, kv.Key, kv.Value.String())
			}
		}
	}
	for _, p := range points {
		check("metric "+p.name, p.attrs.ToSlice())
	}
	for _, s := range spans {
		where := "span " + s.Name()
		check(where, s.Attributes())
		for _, e := range s.Events() {
			check(where+" event "+e.Name, e.Attributes)
		}
		if leaks(s.Status().Description + s.Name()) {
			t.Errorf("%s: status %q carries the sentinel", where, s.Status().Description)
		}
	}
}

// failingStore fails every call with an error quoting the key, as a
// careless store might.
type failingStore struct{ core.Store }

func (failingStore) Claim(_ context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
	return storekit.ClaimResult{}, fmt.Errorf("cannot claim key %q for scope %q", r.Key, r.Scope)
}

func TestNoKeyInAttributes(t *testing.T) {
	for _, scoped := range []bool{false, true} {
		t.Run(fmt.Sprint("scope attribute ", scoped), func(t *testing.T) {
			r := newRig(t, otelidem.WithScopeAttribute(scoped))
			eng := r.engine(t)
			for i := range 3 {
				d, err := eng.Decide(context.Background(), req(fmt.Sprintf("k1-%s-%d", sentinel, i), "x"))
				if err == nil && d.Outcome == core.Proceed {
					_ = eng.Commit(context.Background(), d, adapterkit.Response{Status: 500})
				}
			}
			// The error path: a store whose error quotes the key.
			broken := r.tel.Store(failingStore{r.mem})
			beng, err := core.New(broken, core.WithObserver(r.tel.Observer()),
				core.WithScope(func(context.Context, *core.Request) (string, error) { return "tenant-" + sentinel, nil }))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := beng.Decide(context.Background(), req("k1-"+sentinel+"-err", "x")); err == nil {
				t.Fatal("the failing store did not fail")
			}
			points, spans := r.collect(t), r.spans.Ended()
			if len(points) == 0 || len(spans) == 0 {
				t.Fatal("nothing exported")
			}
			checkNoSentinel(t, points, spans, scoped)
			var sawScope bool
			for _, p := range points {
				if v, ok := p.attrs.Value("idem.scope"); ok && v.AsString() == "tenant-"+sentinel {
					sawScope = true
				}
			}
			if sawScope != scoped {
				t.Errorf("idem.scope exported: %v, want %v", sawScope, scoped)
			}
			if sum(points, "idem.decisions", outcome("store_error")) != 1 {
				t.Error("the store error was not counted")
			}
		})
	}
}
