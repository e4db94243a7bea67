package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// checkMetrics runs the example with -metrics (through fw) and reads
// otelidem's instruments back from GET /metrics, as Prometheus would.
func checkMetrics(t *testing.T, bin, fw string) {
	base := startServer(t, bin, nil, "-framework", fw, "-metrics", "-provider-latency", "0s", "-dsn", memDSN)
	user, key := "u-"+randomID(), "kmetrics-"+randomID()
	for range 2 {
		if r := mustDo(t, http.MethodPost, base+"/v1/payments", user, key, paymentBody(300)); r.status != http.StatusCreated {
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
	}
	r := mustDo(t, http.MethodGet, base+"/metrics", "", "", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d", r.status)
	}
	text := string(r.body)
	for _, want := range []string{
		`idem_decisions_total{`, `idem_outcome="claim"`, `idem_outcome="replay"`, `http_route="/v1/payments"`,
		`idem_commits_total{`, `idem_store_duration_seconds_bucket{`, `idem_phase="decide"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, text)
		}
	}
	if strings.Contains(text, key) || strings.Contains(text, user) {
		t.Error("/metrics carries a key or a scope")
	}
	if r := mustDo(t, http.MethodGet, base+"/openapi.json", "", "", ""); !bytes.Contains(r.body, []byte(`"/metrics"`)) {
		t.Error("/openapi.json does not describe /metrics")
	}
}
