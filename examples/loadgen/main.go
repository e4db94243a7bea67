// Command loadgen drives examples/payments over loopback HTTP with
// PostgreSQL behind it (pgstore in transactional mode; or MySQL/MariaDB
// with mysqlstore, -dsn mysql://…; or SQLite files, -dsn sqlite://DIR) and reports
// throughput and latency percentiles, next to two servers without idem: the
// bare endpoint (baseline) and the background article's design (article).
// It is bounded: a fixed number of requests per scenario, a per-request
// timeout and an overall deadline; it stops by itself, stops its child
// servers and drops their schemas.
//
//	go run ./examples/loadgen                          # defaults below
//	go run ./examples/loadgen -requests 6000 -dups 0,30,90 -logs off
//
// Flags:
//
//	-dsn URL             PostgreSQL (default $IDEM_TEST_PG_DSN, else the
//	                     local test database); a fresh schema per server,
//	                     dropped at the end. Or mysql://user:pass@host:port/db
//	                     (MySQL/MariaDB, mysqlstore; a fresh database per
//	                     server), or sqlite://DIR (a fresh file per server
//	                     in DIR, the temporary directory if empty; sqlite.go)
//	-requests 3000       measured requests per server and duplicate share,
//	                     split over -rounds
//	-rounds 3            alternating rounds: in each, every server in turn
//	                     (the order rotating) gets requests/rounds requests
//	-warmup 300          unmeasured requests before each server's first
//	                     round (and 1/10 of a round before every round)
//	-concurrency 16      concurrent clients (keep-alive connections)
//	-dups 0,30,90        duplicate-key percentages: that share of requests
//	                     retries a key whose first request already completed
//	-pool 16             pool_max_conns of every server's pgxpool
//	-pools LIST          also run idem at dup 0% with these pool sizes
//	                     (pool sizing guidance), e.g. 4,8,32
//	-provider-latency 0s simulated provider latency (every server waits as
//	                     long before its ledger insert)
//	-provider-http       every server calls a provider over HTTP instead:
//	                     a separate process (this binary -serve provider)
//	                     on 127.0.0.1 that answers POST /v1/charges after
//	                     -provider-latency; the servers' clients keep a
//	                     keep-alive pool (examples/payments -provider-url)
//	-db-rtt 0s           added database round-trip time: every server
//	                     reaches the database through a relay on 127.0.0.1
//	                     that holds each chunk for half of it each way
//	                     (a database in another zone; needs a URL -dsn)
//	-framework nethttp   examples/payments -framework
//	-payments-bin PATH   a built examples/payments (default: go build it)
//	-payments-before P   another build of examples/payments (an earlier
//	                     commit: scripts/bench-before.sh), driven as the
//	                     target idem-before, as shipped
//	-payments-flags F    more examples/payments flags for every idem
//	                     target, space-separated (e.g. "-batching=false")
//	-targets idem,baseline,article
//	                     idem-before: -payments-before, as shipped;
//	                     idem-nostep: examples/payments -steps=false (the
//	                     charge as a plain call, no recovery point)
//	-logs default,off    run every server with the example's default
//	                     logging (slog text on stderr, which loadgen reads
//	                     and discards), with logging off, or both
//	-max-duration 10m    overall deadline
//
// Every row reports, besides throughput and latency, the CPU each measured
// request cost the server process and its PostgreSQL backends (µs, Linux;
// cpu.go): at 0 % duplicates, the CPU per first execution.
//
// Each server is a child process (the payments binary, or this binary with
// -serve baseline|article) so that the client's goroutines and the
// server's do not share one Go runtime. Every server gets the same pool
// size; idle pools close their connections within seconds, so only the
// server being driven holds its pool.
//
// The baseline answers POST /v1/payments like the example (X-User-ID
// required, the same body validation, 201 with the same JSON) but writes
// the ledger row in one autocommit INSERT with a random ID: no idempotency
// record, no transaction, so a duplicate is booked again. It is what the
// endpoint costs without idem.
//
// The article server implements the background article's design as
// published (article.go): INSERT ... ON CONFLICT DO NOTHING of a PROCESSING
// row, on a conflict a SELECT of the row (replay, 409 or takeover), the
// business INSERT, the final UPDATE, each in autocommit. It shows what
// idem's guarantees cost against the design users would otherwise copy.
package main

import (
	"context"
	"errors"
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
	dsn          string
	requests     int
	warmup       int
	concurrency  int
	dups         []int
	pool         int
	pools        []int
	framework    string
	latency      time.Duration
	providerHTTP bool
	dbRTT        time.Duration // -db-rtt: added database round trip (dbrelay.go)
	paymentsBin  string
	paymentsPrev string   // -payments-before
	paymentsArgs []string // -payments-flags
	targets      []string
	maxDuration  time.Duration

	rounds int
	logs   []string // "default", "off"

	// child mode
	serve       string // "baseline", "article" or "provider"
	addr        string
	providerURL string
	logFormat   string
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
	if cfg.serve != "" {
		err = serveChild(ctx, cfg.serve, cfg.addr, cfg.dsn, cfg.latency, cfg.providerURL, cfg.logFormat, os.Stderr)
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
		cfg                                      config
		dups, pools, target, logs, paymentsFlags string
	)
	dsn := os.Getenv("IDEM_TEST_PG_DSN")
	if dsn == "" {
		dsn = defaultDSN
	}
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.dsn, "dsn", dsn, "PostgreSQL DSN, mysql://user:pass@host:port/db or sqlite://DIR")
	fs.IntVar(&cfg.requests, "requests", 3000, "measured requests per scenario")
	fs.IntVar(&cfg.warmup, "warmup", 300, "unmeasured requests before a server's first scenario")
	fs.IntVar(&cfg.concurrency, "concurrency", 16, "concurrent clients")
	fs.StringVar(&dups, "dups", "0,30,90", "duplicate-key percentages")
	fs.IntVar(&cfg.pool, "pool", 16, "pool_max_conns of each server")
	fs.StringVar(&pools, "pools", "", "extra idem pool sizes to run at 0% duplicates")
	fs.StringVar(&cfg.framework, "framework", "nethttp", "examples/payments -framework")
	fs.DurationVar(&cfg.latency, "provider-latency", 0, "simulated provider latency (both servers)")
	fs.DurationVar(&cfg.dbRTT, "db-rtt", 0, "added database round-trip time: every server reaches the database through a relay on 127.0.0.1 (dbrelay.go)")
	fs.BoolVar(&cfg.providerHTTP, "provider-http", false, "every server calls an HTTP provider process on 127.0.0.1 (latency -provider-latency)")
	fs.StringVar(&cfg.providerURL, "provider-url", "", "internal: the HTTP provider's base URL (child mode)")
	fs.StringVar(&cfg.paymentsBin, "payments-bin", "", "built examples/payments binary (default: go build)")
	fs.StringVar(&cfg.paymentsPrev, "payments-before", "", "another examples/payments binary (an earlier build), driven as target idem-before")
	fs.StringVar(&paymentsFlags, "payments-flags", "", "more examples/payments flags for every idem target, space-separated (e.g. \"-batching=false\")")
	fs.StringVar(&target, "targets", "idem,baseline,article", "servers to drive: idem, idem-before, idem-nostep, baseline, article")
	fs.StringVar(&logs, "logs", "default,off", "logging of every server: default (the example's: text on stderr), off")
	fs.IntVar(&cfg.rounds, "rounds", 3, "alternating rounds per duplicate share (each server -requests/rounds per round)")
	fs.DurationVar(&cfg.maxDuration, "max-duration", 10*time.Minute, "overall deadline")
	fs.StringVar(&cfg.serve, "serve", "", "internal: serve baseline, article or provider (child mode)")
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:0", "internal: listen address (child mode)")
	fs.StringVar(&cfg.logFormat, "log", "text", "internal: child logging, text | json | none (child mode)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.paymentsArgs = strings.Fields(paymentsFlags)
	var err error
	if cfg.dups, err = intList(dups, 0, 100); err != nil {
		return cfg, fmt.Errorf("-dups: %w", err)
	}
	if cfg.pools, err = intList(pools, 1, 70); err != nil {
		return cfg, fmt.Errorf("-pools: %w", err)
	}
	for _, t := range strings.Split(target, ",") {
		switch t = strings.TrimSpace(t); t {
		case "idem", "idem-nostep", "baseline", "article":
			cfg.targets = append(cfg.targets, t)
		case "idem-before":
			if cfg.paymentsPrev == "" {
				return cfg, errors.New("-targets idem-before needs -payments-before")
			}
			cfg.targets = append(cfg.targets, t)
		case "":
		default:
			return cfg, fmt.Errorf("-targets: unknown %q", t)
		}
	}
	for _, l := range strings.Split(logs, ",") {
		switch l = strings.TrimSpace(l); l {
		case "default", "off":
			cfg.logs = append(cfg.logs, l)
		case "":
		default:
			return cfg, fmt.Errorf("-logs: unknown %q (want default, off)", l)
		}
	}
	if isSQLite(cfg.dsn) && cfg.dbRTT > 0 {
		return cfg, errors.New("-db-rtt: SQLite is in the server's process, no round trip away")
	}
	switch cfg.serve {
	case "", "baseline", "article", "provider":
	default:
		return cfg, fmt.Errorf("-serve %q: want baseline, article or provider", cfg.serve)
	}
	switch {
	case len(cfg.logs) == 0:
		return cfg, errors.New("-logs: empty")
	case cfg.rounds < 1 || cfg.rounds > 100:
		return cfg, fmt.Errorf("-rounds %d out of range [1, 100]", cfg.rounds)
	case cfg.requests < 1 || cfg.requests > 1_000_000:
		return cfg, fmt.Errorf("-requests %d out of range [1, 1000000]", cfg.requests)
	case cfg.warmup < 0:
		return cfg, fmt.Errorf("-warmup %d is negative", cfg.warmup)
	case cfg.concurrency < 1 || cfg.concurrency > 512:
		return cfg, fmt.Errorf("-concurrency %d out of range [1, 512]", cfg.concurrency)
	case cfg.pool < 1 || cfg.pool > 70:
		return cfg, fmt.Errorf("-pool %d out of range [1, 70] (the test server is shared)", cfg.pool)
	case cfg.dbRTT < 0 || cfg.dbRTT > time.Second:
		return cfg, fmt.Errorf("-db-rtt %v out of range [0, 1s]", cfg.dbRTT)
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
