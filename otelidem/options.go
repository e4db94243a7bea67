package otelidem

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Option configures New. Options follow the OpenTelemetry-contrib style: a
// nil Option is ignored.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	mp    metric.MeterProvider
	tp    trace.TracerProvider
	scope bool
}

// WithMeterProvider sets where the metrics go. A nil provider is ignored.
// Default: otel.GetMeterProvider() (the global provider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.mp = mp
		}
	})
}

// WithTracerProvider sets where the spans go. A nil provider is ignored.
// Default: otel.GetTracerProvider() (the global provider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tp = tp
		}
	})
}

// WithScopeAttribute adds the scope (tenant) as the idem.scope attribute on
// metrics and spans. A tenant identifier may be personal data, and as a
// metric label it multiplies the series by the number of tenants: turn it
// on only with few, non-sensitive scopes. Keys are never recorded.
// Default: false.
func WithScopeAttribute(on bool) Option {
	return optionFunc(func(c *config) { c.scope = on })
}

func newConfig(opts []Option) config {
	c := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider()}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}
