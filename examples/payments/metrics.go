package main

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem/otelidem"
)

// newMetrics sets up -metrics: otelidem's instruments on an OpenTelemetry
// meter provider read by OTel's Prometheus exporter, on a registry of its
// own, served by the returned handler at GET /metrics. Store decorates the
// store (spans go to the global tracer provider, a no-op unless a program
// sets one); the observer goes to core.WithObserver.
func newMetrics() (*otelidem.Telemetry, http.Handler, func(context.Context) error, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	tel, err := otelidem.New(otelidem.WithMeterProvider(mp))
	if err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, nil, nil, err
	}
	return tel, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), mp.Shutdown, nil
}
