// Command loadgen drives examples/payments over loopback HTTP with
// PostgreSQL behind it (pgstore in transactional mode) and reports
// throughput and latency percentiles, next to a baseline server that does
// only the ledger insert, without idem. It is bounded: a fixed number of
// requests per scenario, a per-request timeout and an overall deadline;
// it stops by itself, stops its child servers and drops its schema.
//
//	go run ./examples/loadgen                          # defaults below
//	go run ./examples/loadgen -requests 5000 -concurrency 32 -dups 0,30,90
//
// Flags:
//
//	-dsn URL             PostgreSQL (default $IDEM_TEST_PG_DSN, else the
//	                     local test database); a fresh schema is created
//	                     and dropped
//	-requests 3000       measured requests per scenario (after -warmup)
//	-warmup 300          unmeasured requests before each server's first scenario
//	-concurrency 16      concurrent clients (keep-alive connections)
//	-dups 0,30,90        duplicate-key percentages: that share of requests
//	                     retries a key whose first request already completed
//	-pool 16             pool_max_conns of each server's pgxpool
//	-pools LIST          also run idem at dup 0% with these pool sizes
//	                     (pool sizing guidance), e.g. 4,8,32
//	-provider-latency 0s simulated provider latency (the baseline sleeps
//	                     as long before its insert); with a latency, the
//	                     pool bounds throughput: see BENCHMARKS.md
//	-framework nethttp   examples/payments -framework
//	-payments-bin PATH   a built examples/payments (default: go build it)
//	-targets idem,baseline
//	-max-duration 10m    overall deadline
//
// Scenarios run one after another: each server is a child process (the
// payments binary, or this binary with -serve-baseline) so that the
// client's goroutines and the server's do not share one Go runtime.
//
// The baseline answers POST /v1/payments like the example (X-User-ID
// required, the same body validation, 201 with the same JSON) but writes
// the ledger row in one autocommit INSERT with a random ID: no idempotency
// record, no transaction, so a duplicate is booked again. It is what the
// endpoint costs without idem — one commit per request where idem needs
// two on a first execution (claim, then the business transaction that
// also stores the response) and none on a replay.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const defaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

type config struct {
	dsn         string
	requests    int
	warmup      int
	concurrency int
	dups        []int
	pool        int
	pools       []int
	framework   string
	latency     time.Duration
	paymentsBin string
	targets     []string
	maxDuration time.Duration

	// child mode
	serveBaseline bool
	addr          string
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err == flag.ErrHelp {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.serveBaseline {
		err = serveBaseline(ctx, cfg.addr, cfg.dsn, cfg.latency, os.Stderr)
	} else {
		ctx, cancel := context.WithTimeout(ctx, cfg.maxDuration)
		defer cancel()
		err = run(ctx, cfg, os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, out io.Writer) (config, error) {
	var (
		cfg                 config
		dups, pools, target string
	)
	dsn := os.Getenv("IDEM_TEST_PG_DSN")
	if dsn == "" {
		dsn = defaultDSN
	}
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.dsn, "dsn", dsn, "PostgreSQL DSN")
	fs.IntVar(&cfg.requests, "requests", 3000, "measured requests per scenario")
	fs.IntVar(&cfg.warmup, "warmup", 300, "unmeasured requests before a server's first scenario")
	fs.IntVar(&cfg.concurrency, "concurrency", 16, "concurrent clients")
	fs.StringVar(&dups, "dups", "0,30,90", "duplicate-key percentages")
	fs.IntVar(&cfg.pool, "pool", 16, "pool_max_conns of each server")
	fs.StringVar(&pools, "pools", "", "extra idem pool sizes to run at 0% duplicates")
	fs.StringVar(&cfg.framework, "framework", "nethttp", "examples/payments -framework")
	fs.DurationVar(&cfg.latency, "provider-latency", 0, "simulated provider latency (both servers)")
	fs.StringVar(&cfg.paymentsBin, "payments-bin", "", "built examples/payments binary (default: go build)")
	fs.StringVar(&target, "targets", "idem,baseline", "servers to drive: idem, baseline")
	fs.DurationVar(&cfg.maxDuration, "max-duration", 10*time.Minute, "overall deadline")
	fs.BoolVar(&cfg.serveBaseline, "serve-baseline", false, "internal: serve the baseline (child mode)")
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:0", "internal: baseline listen address (child mode)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.dups, err = intList(dups, 0, 100); err != nil {
		return cfg, fmt.Errorf("-dups: %w", err)
	}
	if cfg.pools, err = intList(pools, 1, 70); err != nil {
		return cfg, fmt.Errorf("-pools: %w", err)
	}
	for _, t := range strings.Split(target, ",") {
		switch t = strings.TrimSpace(t); t {
		case "idem", "baseline":
			cfg.targets = append(cfg.targets, t)
		case "":
		default:
			return cfg, fmt.Errorf("-targets: unknown %q", t)
		}
	}
	switch {
	case cfg.requests < 1 || cfg.requests > 1_000_000:
		return cfg, fmt.Errorf("-requests %d out of range [1, 1000000]", cfg.requests)
	case cfg.warmup < 0:
		return cfg, fmt.Errorf("-warmup %d is negative", cfg.warmup)
	case cfg.concurrency < 1 || cfg.concurrency > 512:
		return cfg, fmt.Errorf("-concurrency %d out of range [1, 512]", cfg.concurrency)
	case cfg.pool < 1 || cfg.pool > 70:
		return cfg, fmt.Errorf("-pool %d out of range [1, 70] (the test server is shared)", cfg.pool)
	case cfg.latency < 0:
		return cfg, fmt.Errorf("-provider-latency %v is negative", cfg.latency)
	case cfg.maxDuration <= 0:
		return cfg, fmt.Errorf("-max-duration %v must be positive", cfg.maxDuration)
	}
	return cfg, nil
}

func intList(s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("%q: want integers in [%d, %d]", f, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}
