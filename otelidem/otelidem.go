package otelidem

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/core"
)

// ScopeName is the instrumentation scope of every instrument and tracer.
const ScopeName = "github.com/idemkit/idem/otelidem"

// Attribute keys.
const (
	attrOutcome   = attribute.Key("idem.outcome")
	attrProblem   = attribute.Key("idem.problem")
	attrPhase     = attribute.Key("idem.phase")
	attrScope     = attribute.Key("idem.scope")
	attrRoute     = attribute.Key("http.route")
	attrMethod    = attribute.Key("http.request.method")
	attrStatus    = attribute.Key("http.response.status_code")
	attrClaim     = attribute.Key("idem.claim.outcome")
	attrRecStatus = attribute.Key("idem.record.status")
	attrFencedOut = attribute.Key("idem.fenced_out")
)

// Telemetry holds the instruments; build one per engine (or share one
// across engines) with New.
type Telemetry struct {
	cfg    config
	tracer trace.Tracer

	decisions, commits, leaseLost, hbErrors, waits metric.Int64Counter
	storeDur, waitDur                              metric.Float64Histogram

	waiting waitTracker
}

// New creates the instruments.
func New(opts ...Option) (*Telemetry, error) {
	c := newConfig(opts)
	m := c.mp.Meter(ScopeName)
	t := &Telemetry{cfg: c, tracer: c.tp.Tracer(ScopeName)}
	var errs []error
	counter := func(dst *metric.Int64Counter, name, desc string) {
		var err error
		*dst, err = m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{"+unitOf(name)+"}"))
		errs = append(errs, err)
	}
	counter(&t.decisions, "idem.decisions", "Decisions by outcome and route.")
	counter(&t.commits, "idem.commits", "Commits by outcome (commit, fail, abort, lease_lost) and route.")
	counter(&t.leaseLost, "idem.lease.lost", "Executions that lost their lease to another owner.")
	counter(&t.hbErrors, "idem.heartbeat.errors", "Failed lease renewals.")
	counter(&t.waits, "idem.waits", "Duplicates that waited for an in-flight owner.")
	// Store calls take about a millisecond on a LAN; waits up to the wait
	// option (seconds).
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	var err error
	t.storeDur, err = m.Float64Histogram("idem.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Time spent in the store per phase (decide, commit)."), metric.WithExplicitBucketBoundaries(buckets...))
	errs = append(errs, err)
	t.waitDur, err = m.Float64Histogram("idem.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a duplicate waited for an in-flight owner."), metric.WithExplicitBucketBoundaries(buckets...))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otelidem: %w", err)
	}
	t.waiting.init(t)
	return t, nil
}

func unitOf(name string) string {
	switch name {
	case "idem.decisions":
		return "decision"
	case "idem.commits":
		return "commit"
	case "idem.waits":
		return "wait"
	case "idem.heartbeat.errors":
		return "error"
	}
	return "execution"
}

// Observer returns the function to pass to core.WithObserver. It records
// each event in the instruments; it never blocks and never panics on any
// event.
func (t *Telemetry) Observer() func(core.Event) {
	return t.observe
}

func (t *Telemetry) observe(ev core.Event) {
	ctx := context.Background()
	kind := string(ev.Kind)
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, attrOutcome.String(kind))
	if ev.Route != "" {
		attrs = append(attrs, attrRoute.String(ev.Route))
	}
	if t.cfg.scope && ev.Scope != "" {
		attrs = append(attrs, attrScope.String(ev.Scope))
	}
	if ev.Problem != "" {
		attrs = append(attrs, attrProblem.String(ev.Problem))
	}
	switch ev.Kind {
	case core.EventCommit, core.EventFail, core.EventAbort, core.EventLeaseLost:
		t.commits.Add(ctx, 1, metric.WithAttributes(attrs...))
		t.storeDur.Record(ctx, ev.Duration.Seconds(), metric.WithAttributes(attrPhase.String("commit"), attrOutcome.String(kind)))
		if ev.Kind == core.EventLeaseLost {
			t.leaseLost.Add(ctx, 1, metric.WithAttributes(attrs[1:]...))
		}
	case core.EventHeartbeatError:
		t.hbErrors.Add(ctx, 1, metric.WithAttributes(attrs[1:]...))
		if errors.Is(ev.Err, core.ErrLeaseLost) {
			t.leaseLost.Add(ctx, 1, metric.WithAttributes(attrs[1:]...))
		}
	default:
		if ev.Status != 0 {
			attrs = append(attrs, attrStatus.Int(ev.Status))
		}
		t.decisions.Add(ctx, 1, metric.WithAttributes(attrs...))
		if ev.Kind != core.EventBypass && ev.Kind != core.EventRejected {
			t.storeDur.Record(ctx, ev.Duration.Seconds(), metric.WithAttributes(attrPhase.String("decide"), attrOutcome.String(kind)))
		}
	}
}
