package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	requestTimeout = 15 * time.Second
	users          = 64
	payBody        = `{"amount":1000,"currency":"JPY","to":"alice"}`
)

// result is one scenario's numbers.
type result struct {
	name       string
	logging    string
	rounds     []float64 // req/s of each round
	lat        []time.Duration
	target     string
	pool       int
	dupPct     int
	requests   int
	elapsed    time.Duration
	p50, p99   time.Duration
	mean       time.Duration
	created    int // 201 first executions
	replayed   int // 201 with Idempotent-Replayed: true
	conflicts  int // 409 (duplicate of a request still in flight)
	other      int // anything else, transport errors included
	firstError string
	// CPU of the measured requests (cpu.go), with how many requests it
	// covers; zero counts: not measured.
	serverCPU, dbCPU time.Duration
	serverN, dbN     int
}

func (r result) throughput() float64 { return float64(r.requests) / r.elapsed.Seconds() }

// driver sends requests with keys drawn per the duplicate share.
type driver struct {
	client *http.Client
	url    string
	run    string // unique key prefix

	mu   sync.Mutex
	done []userKey // keys whose first request completed (201)
	next atomic.Int64
}

type userKey struct{ user, key string }

func newDriver(base string, concurrency int) *driver {
	tr := &http.Transport{
		MaxIdleConns:        concurrency,
		MaxIdleConnsPerHost: concurrency,
		IdleConnTimeout:     30 * time.Second,
	}
	return &driver{
		client: &http.Client{Transport: tr, Timeout: requestTimeout},
		url:    base + "/v1/payments",
		run:    strconv.FormatInt(time.Now().UnixNano(), 36),
	}
}

func (d *driver) close() { d.client.CloseIdleConnections() }

// pick returns a duplicate of a completed key with probability dupPct%, else
// a fresh key.
func (d *driver) pick(rng *rand.Rand, dupPct int) (userKey, bool) {
	if dupPct > 0 && rng.IntN(100) < dupPct {
		d.mu.Lock()
		n := len(d.done)
		var k userKey
		if n > 0 {
			k = d.done[rng.IntN(n)]
		}
		d.mu.Unlock()
		if n > 0 {
			return k, true
		}
	}
	i := d.next.Add(1)
	return userKey{user: "u" + strconv.Itoa(int(i%users)), key: d.run + "-" + strconv.FormatInt(i, 10)}, false
}

// load sends n requests over concurrency clients and measures them.
func (d *driver) load(ctx context.Context, n, concurrency, dupPct int, seed uint64) (result, error) {
	r := result{dupPct: dupPct, requests: n}
	lat := make([]time.Duration, n)
	var (
		idx                                 atomic.Int64
		created, replayed, conflicts, other atomic.Int64
		firstErr                            atomic.Value
		wg                                  sync.WaitGroup
	)
	start := time.Now()
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				i := idx.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				k, _ := d.pick(rng, dupPct)
				t0 := time.Now()
				status, replay, err := d.post(ctx, k)
				lat[i] = time.Since(t0)
				switch {
				case err != nil:
					other.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				case status == http.StatusCreated && replay:
					replayed.Add(1)
				case status == http.StatusCreated:
					created.Add(1)
					d.mu.Lock()
					d.done = append(d.done, k)
					d.mu.Unlock()
				case status == http.StatusConflict:
					conflicts.Add(1)
				default:
					other.Add(1)
					firstErr.CompareAndSwap(nil, "status "+strconv.Itoa(status))
				}
			}
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	if err := ctx.Err(); err != nil {
		return r, fmt.Errorf("scenario cut short: %w", err)
	}
	r.lat = lat
	r = r.finish()
	r.lat = lat
	r.created, r.replayed, r.conflicts, r.other = int(created.Load()), int(replayed.Load()), int(conflicts.Load()), int(other.Load())
	if v := firstErr.Load(); v != nil {
		r.firstError = v.(string)
	}
	return r, nil
}

func (d *driver) post(ctx context.Context, k userKey) (status int, replayed bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, strings.NewReader(payBody))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", k.user)
	req.Header.Set("Idempotency-Key", k.key)
	res, err := d.client.Do(req)
	if err != nil {
		return 0, false, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	return res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true", nil
}

// server is one server variant under load.
type server struct {
	target  string // idem, idem-before, idem-nostep, baseline, article
	logging string // default, off
	pool    int
	mysql   bool   // -dsn mysql://: mysqlstore behind the example
	sqlite  bool   // -dsn sqlite://: sqlitestore
	app     string // application_name of its PostgreSQL connections (its schema)
	dups    []int  // the duplicate shares it takes part in
	c       *child
	d       *driver
	drop    func()
}

func (s *server) name() string {
	switch s.target {
	case "idem", "idem-before", "idem-nostep":
		n := "payments + idem (pgstore tx)"
		switch {
		case s.mysql:
			n = "payments + idem (mysqlstore tx)"
		case s.sqlite:
			n = "payments + idem (sqlitestore)"
		}
		switch s.target {
		case "idem-nostep":
			n += ", no step"
		case "idem-before":
			n += ", before"
		}
		return n
	case "article":
		return "article's design"
	}
	return "bare endpoint (baseline)"
}

func (s *server) stop() {
	if s.d != nil {
		s.d.close()
	}
	if s.c != nil {
		s.c.stop()
	}
	if s.drop != nil {
		s.drop()
	}
}

// run starts every server, drives them in alternating rounds and prints the
// table.
func run(ctx context.Context, cfg config, out, logw io.Writer) error {
	tmp, err := os.MkdirTemp("", "loadgen-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := cfg.paymentsBin
	if bin == "" && (slices.Contains(cfg.targets, "idem") || slices.Contains(cfg.targets, "idem-nostep")) {
		fmt.Fprintln(logw, "loadgen: building examples/payments")
		if bin, err = buildPayments(ctx, tmp); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	room, err := newRoomWaiter(ctx, cfg.dsn)
	if err != nil {
		return err
	}
	defer room.close()

	var relay *dbRelay
	if cfg.dbRTT > 0 {
		up, err := dsnUpstream(cfg.dsn)
		if err != nil {
			return err
		}
		if relay, err = startDBRelay(up, cfg.dbRTT); err != nil {
			return err
		}
		defer relay.close()
	}

	var providerArgs []string
	if cfg.providerHTTP {
		prov, err := startChild(ctx, self, "-serve", "provider", "-addr", "127.0.0.1:0", "-provider-latency", cfg.latency.String())
		if err != nil {
			return err
		}
		defer prov.stop()
		providerArgs = []string{"-provider-url", prov.base}
	}

	var servers []*server
	for _, l := range cfg.logs {
		for _, t := range cfg.targets {
			servers = append(servers, &server{target: t, logging: l, pool: cfg.pool, mysql: isMySQL(cfg.dsn), sqlite: isSQLite(cfg.dsn), dups: cfg.dups})
		}
	}
	if slices.Contains(cfg.targets, "idem") {
		for _, p := range cfg.pools {
			if p != cfg.pool {
				servers = append(servers, &server{target: "idem", logging: cfg.logs[0], pool: p, mysql: isMySQL(cfg.dsn), dups: []int{0}})
			}
		}
	}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	for _, s := range servers {
		// A fresh schema per server: every run starts from empty tables.
		schema, drop, err := newSchema(ctx, cfg.dsn)
		if err != nil {
			return err
		}
		s.drop = drop
		if !s.mysql && !s.sqlite {
			s.app = schema
		}
		dsn, err := withParams(cfg.dsn, schema, s.pool)
		if err == nil && relay != nil {
			dsn, err = viaRelay(dsn, relay.addr())
		}
		if err != nil {
			return err
		}
		childLog := "text" // the example's default
		if s.logging == "off" {
			childLog = "none"
		}
		switch s.target {
		case "idem", "idem-before", "idem-nostep":
			args := []string{"-addr", "127.0.0.1:0", "-dsn", dsn, "-framework", cfg.framework,
				"-provider-latency", cfg.latency.String(), "-log", childLog}
			if s.target == "idem-nostep" {
				args = append(args, "-steps=false")
			}
			args = append(args, cfg.paymentsArgs...)
			b := bin
			if s.target == "idem-before" {
				b = cfg.paymentsPrev
			}
			s.c, err = startChild(ctx, b, append(args, providerArgs...)...)
		default:
			s.c, err = startChild(ctx, self, append([]string{"-serve", s.target, "-addr", "127.0.0.1:0", "-dsn", dsn,
				"-provider-latency", cfg.latency.String(), "-log", childLog}, providerArgs...)...)
		}
		if err != nil {
			return err
		}
		s.d = newDriver(s.c.base, cfg.concurrency)
		if cfg.warmup > 0 {
			if err := room.wait(ctx, s.pool); err != nil {
				return err
			}
			if _, err := s.d.load(ctx, cfg.warmup, cfg.concurrency, 0, 99); err != nil {
				return err
			}
		}
	}

	per := max(1, cfg.requests/cfg.rounds)
	warm := max(cfg.concurrency, per/10)
	var results []result
	for di, dup := range cfg.dups {
		var in []*server
		for _, s := range servers {
			if slices.Contains(s.dups, dup) {
				in = append(in, s)
			}
		}
		acc := make([]result, len(in))
		for round := range cfg.rounds {
			for k := range in {
				i := (k + round) % len(in) // rotate the order every round
				s := in[i]
				fmt.Fprintf(logw, "loadgen: dup=%d%% round %d/%d: %s, logging %s, pool %d: %d requests, %d clients\n",
					dup, round+1, cfg.rounds, s.target, s.logging, s.pool, per, cfg.concurrency)
				// Unmeasured: wait for room for its pool, reconnect the
				// pool (idle pools close) and warm its statements.
				if err := room.wait(ctx, s.pool); err != nil {
					return err
				}
				if _, err := s.d.load(ctx, warm, cfg.concurrency, dup, uint64(1000+round)); err != nil {
					return err
				}
				c0 := room.snap(ctx, s)
				r, err := s.d.load(ctx, per, cfg.concurrency, dup, uint64(di*100+round+1))
				if err != nil {
					return err
				}
				c1 := room.snap(ctx, s)
				if n := newBackends(c0, c1); n > 0 {
					fmt.Fprintf(logw, "loadgen: %s: %d backends connected during the measured round (their start-up CPU is counted)\n", s.target, n)
				}
				if srv, db, srvOK, dbOK := cpuDelta(c0, c1); srvOK || dbOK {
					if srvOK {
						r.serverCPU, r.serverN = time.Duration(srv), r.requests
					}
					if dbOK {
						r.dbCPU, r.dbN = time.Duration(db), r.requests
					}
				}
				acc[i] = acc[i].add(r)
			}
		}
		for i, s := range in {
			r := acc[i].finish()
			r.target, r.logging, r.pool, r.dupPct = s.target, s.logging, s.pool, dup
			r.name = s.name()
			results = append(results, r)
		}
	}
	report(out, cfg, results)
	return nil
}

// add accumulates a round into a scenario's result.
func (r result) add(o result) result {
	r.requests += o.requests
	r.elapsed += o.elapsed
	r.created += o.created
	r.replayed += o.replayed
	r.conflicts += o.conflicts
	r.other += o.other
	r.serverCPU += o.serverCPU
	r.serverN += o.serverN
	r.dbCPU += o.dbCPU
	r.dbN += o.dbN
	r.lat = append(r.lat, o.lat...)
	if r.firstError == "" {
		r.firstError = o.firstError
	}
	r.rounds = append(r.rounds, o.throughput())
	return r
}

// finish computes the percentiles of the accumulated latencies.
func (r result) finish() result {
	if len(r.lat) == 0 {
		return r
	}
	slices.Sort(r.lat)
	var sum time.Duration
	for _, l := range r.lat {
		sum += l
	}
	n := len(r.lat)
	r.mean = sum / time.Duration(n)
	r.p50 = r.lat[n/2]
	r.p99 = r.lat[min(n-1, n*99/100)]
	r.lat = nil
	return r
}

func report(w io.Writer, cfg config, rs []result) {
	provider := "simulated in process"
	if cfg.providerHTTP {
		provider = "over HTTP (one provider process)"
	}
	db := "database on loopback"
	if cfg.dbRTT > 0 {
		db = fmt.Sprintf("database round trip +%v (relay)", cfg.dbRTT)
	}
	extra := ""
	if len(cfg.paymentsArgs) > 0 {
		extra = fmt.Sprintf(" %q", cfg.paymentsArgs)
	}
	fmt.Fprintf(w, "\nloadgen: %d requests per row in %d alternating rounds, %d clients, pool %d on every server, -framework %s%s, provider %s, provider latency %v, %s, GOMAXPROCS %d, %s\n\n",
		cfg.requests, cfg.rounds, cfg.concurrency, cfg.pool, cfg.framework, extra, provider, cfg.latency, db, runtime.GOMAXPROCS(0), time.Now().UTC().Format(time.RFC3339))
	type k struct {
		target, logging string
		dup             int
	}
	tp := map[k]float64{}
	for _, r := range rs {
		if r.pool == cfg.pool {
			tp[k{r.target, r.logging, r.dupPct}] = r.throughput()
		}
	}
	ratio := func(r result, target string) string {
		b, ok := tp[k{target, r.logging, r.dupPct}]
		if !ok || r.target == target {
			return "—"
		}
		return fmt.Sprintf("%.2f×", r.throughput()/b)
	}
	fmt.Fprintln(w, "| server | logging | pool | dup % | req/s | per round | vs baseline | vs article | vs idem | p50 ms | p99 ms | mean ms | server µs/req | database µs/req | 201 new | 201 replayed | 409 | other |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		var per []string
		for _, x := range r.rounds {
			per = append(per, fmt.Sprintf("%.0f", x))
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %.0f | %s | %s | %s | %s | %.2f | %.2f | %.2f | %s | %s | %d | %d | %d | %d |\n",
			r.name, r.logging, r.pool, r.dupPct, r.throughput(), strings.Join(per, " / "), ratio(r, "baseline"), ratio(r, "article"), ratio(r, "idem"),
			ms(r.p50), ms(r.p99), ms(r.mean), perReq(r.serverCPU, r.serverN), perReq(r.dbCPU, r.dbN), r.created, r.replayed, r.conflicts, r.other)
	}
	for _, r := range rs {
		if r.firstError != "" {
			fmt.Fprintf(w, "\n%s (logging %s) pool=%d dup=%d%%: first error: %s\n", r.target, r.logging, r.pool, r.dupPct, r.firstError)
		}
	}
}

// perReq is CPU per request in µs, or "—" when not measured.
func perReq(cpu time.Duration, n int) string {
	if n == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", float64(cpu.Microseconds())/float64(n))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
