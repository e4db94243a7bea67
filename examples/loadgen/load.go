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
	slices.Sort(lat)
	var sum time.Duration
	for _, l := range lat {
		sum += l
	}
	r.mean = sum / time.Duration(n)
	r.p50 = lat[n/2]
	r.p99 = lat[min(n-1, n*99/100)]
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

// run drives every target and prints the table.
func run(ctx context.Context, cfg config, out, logw io.Writer) error {
	tmp, err := os.MkdirTemp("", "loadgen-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := cfg.paymentsBin
	if bin == "" && slices.Contains(cfg.targets, "idem") {
		fmt.Fprintln(logw, "loadgen: building examples/payments")
		if bin, err = buildPayments(ctx, tmp); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	type scenario struct {
		target string
		pool   int
		dups   []int
	}
	var scenarios []scenario
	for _, t := range cfg.targets {
		scenarios = append(scenarios, scenario{t, cfg.pool, cfg.dups})
	}
	if slices.Contains(cfg.targets, "idem") {
		for _, p := range cfg.pools {
			if p != cfg.pool {
				scenarios = append(scenarios, scenario{"idem", p, []int{0}})
			}
		}
	}

	var results []result
	for _, sc := range scenarios {
		// A fresh schema per server: every run starts from empty tables.
		schema, drop, err := newSchema(ctx, cfg.dsn)
		if err != nil {
			return err
		}
		dsn, err := withParams(cfg.dsn, schema, sc.pool)
		if err != nil {
			drop()
			return err
		}
		var c *child
		if sc.target == "idem" {
			c, err = startChild(ctx, bin, "-addr", "127.0.0.1:0", "-dsn", dsn, "-framework", cfg.framework,
				"-provider-latency", cfg.latency.String(), "-log", "json")
		} else {
			c, err = startChild(ctx, self, "-serve-baseline", "-addr", "127.0.0.1:0", "-dsn", dsn,
				"-provider-latency", cfg.latency.String())
		}
		if err != nil {
			drop()
			return err
		}
		d := newDriver(c.base, cfg.concurrency)
		if cfg.warmup > 0 {
			if _, err := d.load(ctx, cfg.warmup, cfg.concurrency, 0, 99); err != nil {
				d.close()
				c.stop()
				drop()
				return err
			}
		}
		for i, dup := range sc.dups {
			fmt.Fprintf(logw, "loadgen: %s pool=%d dup=%d%%: %d requests, %d clients\n", sc.target, sc.pool, dup, cfg.requests, cfg.concurrency)
			r, err := d.load(ctx, cfg.requests, cfg.concurrency, dup, uint64(i+1))
			r.target, r.pool = sc.target, sc.pool
			if err != nil {
				d.close()
				c.stop()
				drop()
				return err
			}
			results = append(results, r)
		}
		d.close()
		c.stop()
		drop()
	}
	report(out, cfg, results)
	return nil
}

func report(w io.Writer, cfg config, rs []result) {
	fmt.Fprintf(w, "\nloadgen: %d requests per row, %d clients, -framework %s, provider latency %v, GOMAXPROCS %d, %s\n\n",
		cfg.requests, cfg.concurrency, cfg.framework, cfg.latency, runtime.GOMAXPROCS(0), time.Now().UTC().Format(time.RFC3339))
	base := map[int]float64{}
	for _, r := range rs {
		if r.target == "baseline" {
			base[r.dupPct] = r.throughput()
		}
	}
	fmt.Fprintln(w, "| server | pool | dup % | req/s | vs baseline | p50 ms | p99 ms | mean ms | 201 new | 201 replayed | 409 | other |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		ratio := "—"
		if b, ok := base[r.dupPct]; ok && r.target != "baseline" {
			ratio = fmt.Sprintf("%.2f×", r.throughput()/b)
		}
		name := "payments + idem (pgstore tx)"
		if r.target == "baseline" {
			name = "ledger insert only"
		}
		fmt.Fprintf(w, "| %s | %d | %d | %.0f | %s | %.2f | %.2f | %.2f | %d | %d | %d | %d |\n",
			name, r.pool, r.dupPct, r.throughput(), ratio, ms(r.p50), ms(r.p99), ms(r.mean),
			r.created, r.replayed, r.conflicts, r.other)
	}
	for _, r := range rs {
		if r.firstError != "" {
			fmt.Fprintf(w, "\n%s pool=%d dup=%d%%: first error: %s\n", r.target, r.pool, r.dupPct, r.firstError)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
