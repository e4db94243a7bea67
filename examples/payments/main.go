// Command payments is a payments API protected by idem, served through any
// of idem's adapters. With no flags it runs self-contained on 127.0.0.1:8080
// (sqlitestore and the ledger in one SQLite file, idem/payments.db under
// the user's cache directory, printed at start-up, so keys survive a
// restart; and a simulated payment provider):
//
//	go run ./examples/payments
//
//	curl -i -X POST localhost:8080/v1/payments -H 'X-User-ID: u1' \
//	     -H 'Idempotency-Key: k1' -d '{"amount":1000,"currency":"JPY","to":"alice"}'
//
// Flags:
//
//	-addr 127.0.0.1:8080        listen address (port 0: any free port; the
//	                            "listening" log line tells which)
//	-framework nethttp          nethttp | gin | echo | echov5 | fiber | fiberv3
//	-dsn URL                    default $DATABASE_URL; empty: the SQLite default
//	                            above. sqlite://PATH: sqlitestore in
//	                            transactional mode on that file, the ledger
//	                            table in it, both migrated at start (one host;
//	                            several processes may share the file, not over
//	                            a network file system). mem: memstore and an
//	                            in-memory ledger, forgotten at exit (tests,
//	                            several instances side by side).
//	                            postgres://...: pgstore in
//	                            transactional mode, the ledger table in the same
//	                            database, both migrated at start; a search_path
//	                            in the DSN selects the schema (default public).
//	                            mysql://user:pass@host:port/db: mysqlstore, the
//	                            same way (MySQL 8+, MariaDB 10.6+, Galera);
//	                            pool_max_conns=N sets its pool (default 32)
//	-provider-url URL           external payment provider (default: simulated)
//	-provider-latency 300ms     latency of the simulated provider
//	-book-latency 0s            simulated business time between the provider's
//	                            answer (stored as a recovery point, core.Step)
//	                            and booking the ledger row
//	-steps=true                 the provider charge is a recovery point
//	                            (core.Step): its answer is committed before the
//	                            booking, so an instance taking the key over
//	                            after a crash books that charge instead of
//	                            calling the provider again. -steps=false makes
//	                            it a plain call: one durable commit less per
//	                            first execution, and after a crash between the
//	                            charge and the booking the provider is called
//	                            again with the same relayed key (its own
//	                            deduplication is then the only wall)
//	-batching=false             PostgreSQL: every request sends its own
//	                            statements (pgstore.WithoutBatching). By
//	                            default concurrent requests share claim,
//	                            complete and step statements as the database's
//	                            load calls for
//	-completer-interval 10s     how often the in-process completer
//	                            (core/completer) looks for payments whose owner
//	                            died after the charge and whose client never
//	                            retried, and books them; 0 turns it off
//	-completer-after 0s         how long past the lapsed lease such a payment
//	                            must be before the completer takes it
//	-lease 30s                  idem lease (core.WithLease)
//	-wait 0s                    in-flight wait (core.WithWait); 0 answers 409
//	-retention 24h              how long keys are kept (core.WithRetention)
//	-tx-pooler                  -dsn goes through PgBouncer in transaction pooling
//	                            (pgstore.WithTransactionPooler; add
//	                            default_query_exec_mode=exec to -dsn)
//	-listen-dsn URL             direct connection for wait mode's LISTEN behind
//	                            such a pooler (pgstore.WithListenConnString);
//	                            without it waiting duplicates poll (logged)
//	-metrics                    GET /metrics: otelidem's OpenTelemetry metrics
//	                            through OTel's Prometheus exporter
//	-log text                   log format on stderr: text | json | none
//	-cpuprofile FILE            write a pprof CPU profile of the run to FILE
//	-debug-addr ADDR            serve GET /debug/vars (expvar: memstats,
//	                            goroutines, live heap) and /debug/pprof/ on
//	                            its own listener (make soak)
//
// API:
//
//	POST /v1/payments   X-User-ID (the scope; missing: 401, before idem),
//	                    Idempotency-Key (required),
//	                    {"amount":1000,"currency":"JPY","to":"alice"}
//	                    -> 201 {"id","amount","currency","to","provider_charge_id"}
//	                    (a bad body is a 400, stored and replayed like any
//	                    final response; a provider failure is a 502 and leaves
//	                    the key retryable)
//	GET  /v1/payments   X-User-ID -> 200, that user's ledger rows (JSON array)
//	GET  /healthz       -> 200
//	GET  /openapi.json  -> 200, this API as OpenAPI 3.1, with the idempotency
//	                    policy the engine runs with (openapi.New(eng.Policy()))
//
// The external provider protocol: POST {provider-url}/v1/charges with header
// Idempotency-Key = core.RelayKey(ctx, "charge") and body
// {"amount","currency","to"}, answered 200 {"id":"ch_..."}; any other answer
// is a failure.
//
// The business logic (service.go) is written once; each serve_<framework>.go
// only mounts it behind that framework's idem adapter. SIGINT or SIGTERM
// shuts the server down gracefully: requests in flight finish and commit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/pgstore"
)

// serveFunc serves a on ln until ctx is done, then shuts down gracefully.
type serveFunc func(ctx context.Context, ln net.Listener, a *app) error

// frameworks maps -framework values to their serve functions.
var frameworks = map[string]serveFunc{
	"nethttp": serveNetHTTP,
	"gin":     serveGin,
	"echo":    serveEcho,
	"echov5":  serveEchoV5,
	"fiber":   serveFiber,
	"fiberv3": serveFiberV3,
}

// app is what every framework mounts.
type app struct {
	svc     *Service
	eng     *core.Engine
	log     *slog.Logger
	openapi []byte       // GET /openapi.json
	metrics http.Handler // GET /metrics (-metrics), else nil
}

type config struct {
	addr            string
	framework       string
	dsn             string
	providerURL     string
	providerLatency time.Duration
	bookLatency     time.Duration
	steps           bool // the charge is a recovery point (core.Step)
	batching        bool // false: pgstore.WithoutBatching
	completerEvery  time.Duration
	completerAfter  time.Duration
	lease           time.Duration
	wait            time.Duration
	retention       time.Duration
	metrics         bool
	txPooler        bool   // -dsn goes through a transaction pooler (PgBouncer)
	listenDSN       string // direct connection for wait mode's LISTEN
	logFormat       string
	cpuProfile      string // -cpuprofile: pprof CPU profile of the whole run
	debugAddr       string // -debug-addr: expvar listener
}

const (
	// defaultPoolSize is the pgxpool size unless the DSN sets
	// pool_max_conns (pgxpool's own default, max(4, cores), starves a
	// payments service: every request in its database phase holds a
	// connection). pgstore/README.md, "Pool sizing", says how to choose.
	defaultPoolSize = 16

	shutdownTimeout = 15 * time.Second
	providerTimeout = 10 * time.Second
	maintainEvery   = 10 * time.Minute
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.cpuProfile != "" {
		stopProfile, err := startCPUProfile(cfg.cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "payments: -cpuprofile:", err)
			os.Exit(2)
		}
		defer stopProfile()
	}
	if err := run(ctx, cfg, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}

func frameworkNames() []string {
	names := make([]string, 0, len(frameworks))
	for n := range frameworks {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func parseFlags(args []string, out io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:8080", "listen address")
	fs.StringVar(&cfg.framework, "framework", "nethttp", "HTTP framework: "+strings.Join(frameworkNames(), " | "))
	fs.StringVar(&cfg.dsn, "dsn", os.Getenv("DATABASE_URL"), "sqlite://PATH (sqlitestore), mem: (in-memory store and ledger), postgres://... (pgstore) or mysql://user:pass@host:port/db (mysqlstore); default $DATABASE_URL; empty: sqlite://"+defaultSQLitePath())
	fs.StringVar(&cfg.providerURL, "provider-url", "", "external payment provider base URL (default: in-process simulation)")
	fs.DurationVar(&cfg.providerLatency, "provider-latency", 300*time.Millisecond, "latency of the simulated provider")
	fs.DurationVar(&cfg.bookLatency, "book-latency", 0, "simulated business time between the provider's answer and booking the ledger row")
	fs.BoolVar(&cfg.steps, "steps", true, "keep the provider charge as a recovery point (core.Step); false: a plain call, one commit less, no recovery point")
	fs.BoolVar(&cfg.batching, "batching", true, "PostgreSQL: concurrent requests share claim, complete and step statements as the database's load calls for; false: each sends its own (pgstore.WithoutBatching)")
	fs.DurationVar(&cfg.completerEvery, "completer-interval", 10*time.Second, "how often the in-process completer books payments whose owner died after the charge and whose client never retried (0: off)")
	fs.DurationVar(&cfg.completerAfter, "completer-after", 0, "how long past the lapsed lease such a payment must be before the completer takes it")
	fs.DurationVar(&cfg.lease, "lease", 30*time.Second, "idem lease")
	fs.DurationVar(&cfg.wait, "wait", 0, "how long a duplicate waits for the in-flight request (0: answer 409 at once)")
	fs.BoolVar(&cfg.txPooler, "tx-pooler", false, "-dsn goes through a transaction pooler (PgBouncer pool_mode=transaction): wait mode LISTENs on -listen-dsn, or polls")
	fs.StringVar(&cfg.listenDSN, "listen-dsn", "", "direct PostgreSQL connection for wait mode's LISTEN when -dsn goes through a transaction pooler")
	fs.BoolVar(&cfg.metrics, "metrics", false, "serve OpenTelemetry metrics (otelidem) at GET /metrics in the Prometheus format")
	fs.DurationVar(&cfg.retention, "retention", 24*time.Hour, "how long idempotency keys are kept (must exceed -lease)")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a pprof CPU profile of the run to this file (stopped at shutdown)")
	fs.StringVar(&cfg.debugAddr, "debug-addr", "", "serve GET /debug/vars (expvar: memstats, goroutines) on this address (default: not served)")
	fs.StringVar(&cfg.logFormat, "log", "text", "log format on stderr: text | json | none (start-up line only)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if _, ok := frameworks[cfg.framework]; !ok {
		return cfg, fmt.Errorf("-framework %q: want one of %s", cfg.framework, strings.Join(frameworkNames(), ", "))
	}
	if !slices.Contains([]string{"text", "json", "none"}, cfg.logFormat) {
		return cfg, fmt.Errorf("-log %q: want text, json or none", cfg.logFormat)
	}
	if cfg.providerLatency < 0 {
		return cfg, fmt.Errorf("-provider-latency %v is negative", cfg.providerLatency)
	}
	if cfg.bookLatency < 0 {
		return cfg, fmt.Errorf("-book-latency %v is negative", cfg.bookLatency)
	}
	if cfg.completerEvery < 0 || cfg.completerAfter < 0 {
		return cfg, fmt.Errorf("-completer-interval %v, -completer-after %v: must not be negative", cfg.completerEvery, cfg.completerAfter)
	}
	return cfg, nil
}

func newLogger(format string, w io.Writer) *slog.Logger {
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil))
	case "none":
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

// run builds the app from cfg and serves it until ctx is done.
func run(ctx context.Context, cfg config, logOut io.Writer) error {
	log := newLogger(cfg.logFormat, logOut)

	var provider Provider
	providerDesc := "simulated"
	if cfg.providerURL != "" {
		hp := newHTTPProvider(cfg.providerURL, providerTimeout)
		defer hp.client.CloseIdleConnections()
		provider = hp
		providerDesc = cfg.providerURL
	} else {
		provider = newSimProvider(cfg.providerLatency, log, cfg.retention)
	}

	var (
		store     core.Store
		ledger    Ledger
		storeDesc string
	)
	if cfg.dsn == memDSN {
		ml := newMemLedger()
		store = ledgerStore{Store: memstore.New(), ledger: ml, log: log}
		ledger = ml
		storeDesc = "memstore"
	} else if path, ok := sqlitePath(cfg.dsn); ok {
		db, ss, sl, err := openSQLite(ctx, path, retentionMargin(cfg))
		if err != nil {
			return err
		}
		defer db.Close()
		defer ss.Close() // its watch poller (-wait); before the db
		store, ledger = ss, sl
		storeDesc = "sqlitestore (transactional, file " + path + ")"
		mctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go maintain(mctx, ss, maintainInterval(cfg), log)
	} else if isMySQLDSN(cfg.dsn) {
		db, ms, ml, dbName, err := openMySQL(ctx, cfg)
		if err != nil {
			return err
		}
		defer db.Close()
		store, ledger = ms, ml
		storeDesc = "mysqlstore (transactional, database " + dbName + ")"
		mctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go maintain(mctx, ms, maintainInterval(cfg), log)
	} else {
		pool, ps, pl, schema, err := openPG(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer pool.Close()
		defer ps.Close() // its LISTEN connection, if a duplicate is waiting (-wait); before the pool
		store, ledger = ps, pl
		storeDesc = "pgstore (transactional, schema " + schema + ")"
		mctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go maintain(mctx, ps, maintainInterval(cfg), log)
	}

	opts := engineOptions(cfg, log)
	var metrics http.Handler
	if cfg.metrics {
		tel, h, shutdown, err := newMetrics()
		if err != nil {
			return fmt.Errorf("-metrics: %w", err)
		}
		defer func() { _ = shutdown(context.Background()) }()
		store = tel.Store(store)
		opts = append(opts, core.WithObserver(tel.Observer()))
		metrics = h
	}
	eng, err := core.New(store, opts...)
	if err != nil {
		return err
	}
	a := &app{svc: &Service{ledger: ledger, provider: provider, bookLatency: cfg.bookLatency, noStep: !cfg.steps, log: log}, eng: eng, log: log, metrics: metrics}
	if a.openapi, err = openAPIJSON(eng, cfg.metrics); err != nil {
		return err
	}

	if cfg.debugAddr != "" {
		stopDebug, err := serveDebugVars(cfg.debugAddr, log)
		if err != nil {
			return fmt.Errorf("-debug-addr: %w", err)
		}
		defer stopDebug()
	}
	if cfg.completerEvery > 0 {
		c, err := newCompleter(a, cfg)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { _ = c.Run(cctx) }()
	}

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	startLog := log
	if cfg.logFormat == "none" { // the address is still announced, as JSON
		startLog = newLogger("json", logOut)
	}
	startLog.Info("listening", "addr", ln.Addr().String(), "framework", cfg.framework, "store", storeDesc,
		"provider", providerDesc, "steps", cfg.steps, "book_latency", cfg.bookLatency, "lease", cfg.lease, "wait", cfg.wait,
		"completer_interval", cfg.completerEvery)
	err = frameworks[cfg.framework](ctx, ln, a)
	log.Info("stopped", "err", err)
	return err
}

// retentionMargin is how long the stores keep records past expiry: the
// stores' default (an hour), or the retention when that is shorter, so
// that a short -retention (a soak) bounds the rows as it says.
func retentionMargin(cfg config) time.Duration {
	return min(pgstore.DefaultRetentionMargin, cfg.retention)
}

// maintainInterval is how often retention runs: every 10 minutes, or
// every retention when that is shorter.
func maintainInterval(cfg config) time.Duration { return min(maintainEvery, cfg.retention) }

// engineOptions are the engine's options from the flags; GET /openapi.json
// publishes the policy they make.
func engineOptions(cfg config, log *slog.Logger) []core.Option {
	return []core.Option{
		core.WithLease(cfg.lease),
		core.WithWait(cfg.wait),
		core.WithRetention(cfg.retention),
		core.WithLogger(log),
		// The provider charge is a recovery point (core.Step, -steps):
		// refuse a store that cannot keep it rather than charge
		// unprotected.
		core.WithStepsRequired(cfg.steps),
	}
}

// openPG connects, migrates the store and the ledger, and builds both. The
// schema is the first entry of the DSN's search_path, else "public".
func openPG(ctx context.Context, cfg config, log *slog.Logger) (*pgxpool.Pool, *pgstore.Store, *pgLedger, string, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.dsn)
	if err != nil {
		return nil, nil, nil, "", fmt.Errorf("-dsn: %w", err)
	}
	if !strings.Contains(cfg.dsn, "pool_max_conns") {
		pcfg.MaxConns = defaultPoolSize
	}
	txIdle := 2*providerTimeout + cfg.lease
	if _, set := pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !set && !cfg.txPooler {
		// End a business transaction abandoned by a bug rather than pin its
		// locks forever. Set once per connection, at connect: every other
		// statement on this pool is autocommit, and
		// pgstore.WithTxIdleTimeout would send a set_config with every
		// first execution (issue 21). Not through a transaction pooler:
		// PgBouncer refuses startup parameters it does not know, and a
		// session setting would not follow the client anyway; there
		// WithTxIdleTimeout sets it per transaction.
		pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(txIdle.Milliseconds(), 10)
	}
	schema := schemaFromSearchPath(pcfg.ConnConfig.RuntimeParams["search_path"])
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, pcfg)
	if err != nil {
		return nil, nil, nil, "", fmt.Errorf("connect: %w", err)
	}
	fail := func(err error) (*pgxpool.Pool, *pgstore.Store, *pgLedger, string, error) {
		pool.Close()
		return nil, nil, nil, "", err
	}
	if err := pool.Ping(cctx); err != nil {
		return fail(fmt.Errorf("connect: %w", err))
	}
	opts := []pgstore.Option{
		pgstore.WithSchema(schema),
		// The ledger row is queued with pgstore.Defer (it commits with the
		// stored response, in the complete's round trip) but the claims
		// stay synchronous: every execution relays a key to the
		// provider, and an asynchronous claim (WithTransactional) must then
		// be made durable before the key leaves (SyncClaim: one more round
		// trip and row version, the same number of WAL flushes). Issue 21.
		pgstore.WithLogger(log),
		pgstore.WithRetentionMargin(retentionMargin(cfg)),
	}
	if !cfg.batching {
		opts = append(opts, pgstore.WithoutBatching())
	}
	if cfg.txPooler {
		opts = append(opts, pgstore.WithTransactionPooler(), pgstore.WithTxIdleTimeout(txIdle))
	}
	if cfg.listenDSN != "" {
		opts = append(opts, pgstore.WithListenConnString(cfg.listenDSN))
	}
	if err := pgstore.Migrate(cctx, pool, opts...); err != nil {
		return fail(err)
	}
	store, err := pgstore.New(pool, opts...)
	if err != nil {
		return fail(err)
	}
	ledger := newPGLedger(pool, schema)
	if err := ledger.migrate(cctx); err != nil {
		return fail(fmt.Errorf("ledger migration: %w", err))
	}
	return pool, store, ledger, schema, nil
}

func schemaFromSearchPath(sp string) string {
	first, _, _ := strings.Cut(sp, ",")
	first = strings.Trim(strings.TrimSpace(first), `"`)
	if first == "" || strings.HasPrefix(first, "$") {
		return "public"
	}
	return first
}

// readTimeout bounds reading a request, headers and body, on every server
// (fiber's ReadTimeout, v2 and v3, net/http's ReadHeaderTimeout and
// ReadTimeout): a client that sends slowly is cut off after it
// (TestSlowBodies), and on fiber a connection that never sends a request
// stops holding a graceful shutdown (TestShutdownWithSilentConnection).
const readTimeout = 5 * time.Second

// serveHTTP serves h on ln until ctx is done, then shuts down gracefully:
// requests in flight finish (and commit) before it returns.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readTimeout,
		// A body that trickles would otherwise hold its connection and
		// goroutine for as long as the client likes. The deadline covers
		// the whole request read, not the handler: a payment that takes
		// longer still completes.
		ReadTimeout: readTimeout,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
