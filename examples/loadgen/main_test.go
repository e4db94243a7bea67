package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.requests != 3000 || cfg.concurrency != 16 || len(cfg.dups) != 3 || len(cfg.targets) != 3 ||
		cfg.rounds != 3 || len(cfg.logs) != 2 {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, err = parseFlags([]string{"-payments-flags", " -batching=false  -steps=false "}, io.Discard)
	if err != nil || !slices.Equal(cfg.paymentsArgs, []string{"-batching=false", "-steps=false"}) {
		t.Errorf("-payments-flags: %q, %v", cfg.paymentsArgs, err)
	}
	for _, args := range [][]string{
		{"-dups", "101"}, {"-pool", "71"}, {"-pools", "0"}, {"-requests", "0"},
		{"-concurrency", "0"}, {"-targets", "redis"}, {"-provider-latency", "-1s"}, {"extra"},
		{"-logs", "verbose"}, {"-logs", ""}, {"-rounds", "0"}, {"-serve", "redis"}, {"-db-rtt", "-1ms"}, {"-db-rtt", "2s"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func TestWithParams(t *testing.T) {
	got, err := withParams("postgres://u@h:5432/db?sslmode=disable", "s1", 7)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"search_path=s1", "application_name=s1", "pool_max_conns=7", "sslmode=disable", "pool_max_conn_idle_time=15s"} {
		if !strings.Contains(got, want) {
			t.Errorf("%s lacks %s", got, want)
		}
	}
	if got, _ := withParams("host=h dbname=db", "s1", 7); got != "host=h dbname=db search_path=s1 application_name=s1 pool_max_conns=7 pool_max_conn_idle_time=15s pool_health_check_period=1s" {
		t.Errorf("key=value form: %q", got)
	}
}

// TestLoadCountsReplays drives a stub that answers like the payments
// example: 201, marked replayed for a key it has seen.
func TestLoadCountsReplays(t *testing.T) {
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("X-User-ID") + "/" + r.Header.Get("Idempotency-Key")
		mu.Lock()
		replay := seen[k]
		seen[k] = true
		mu.Unlock()
		if replay {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	d := newDriver(srv.URL, 4)
	defer d.close()
	r, err := d.load(context.Background(), 400, 4, 50, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.created+r.replayed != 400 || r.other != 0 || r.conflicts != 0 {
		t.Fatalf("counts: %+v", r)
	}
	if r.replayed < 100 || r.replayed > 300 {
		t.Errorf("replayed %d of 400 at 50%% duplicates", r.replayed)
	}
	if r.p50 <= 0 || r.p99 < r.p50 {
		t.Errorf("percentiles: p50 %v p99 %v", r.p50, r.p99)
	}
}

func TestWithParamsMySQL(t *testing.T) {
	got, err := withParams("mysql://root:pw@127.0.0.1:3306/test?parseTime=true", "loadgen_x", 7)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"/loadgen_x?", "pool_max_conns=7", "parseTime=true", "root:pw@127.0.0.1:3306"} {
		if !strings.Contains(got, want) {
			t.Errorf("%s lacks %s", got, want)
		}
	}
	if _, err := parseFlags([]string{"-dsn", "sqlite://", "-db-rtt", "2ms"}, io.Discard); err == nil {
		t.Error("-db-rtt accepted with a sqlite:// DSN")
	}
	if _, err := parseFlags([]string{"-targets", "idem,idem-before"}, io.Discard); err == nil {
		t.Error("-targets idem-before accepted without -payments-before")
	}
}
