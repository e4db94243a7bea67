// Command soak runs examples/payments for a long while on each store under
// steady load with duplicates, SIGKILLing one of its two instances (each
// runs the completer) at intervals, and samples every -sample: requests per
// second, the surviving instance's RSS, live Go heap (as the last GC found
// it), goroutines and open file
// descriptors, the database's connections and the rows of each table. It
// ends with the growth from minute 2 to the end. It is bounded (-duration
// per store), targets 127.0.0.1, and removes what it creates (its schema,
// database or file, its processes).
//
//	make soak                                      # every store, 10 minutes each
//	go run ./examples/soak -stores sqlite -duration 2m
//
// Flags: -stores sqlite,postgres,mysql; -duration 10m (per store); -sample
// 30s; -clients 8; -dup 30 (percent of requests that retry a recent key);
// -kill-every 1m (SIGKILL the second instance, then restart it);
// -retention 1m (the example's -retention: the idem rows it leaves are
// bounded by it); -pg URL (default postgres://postgres@127.0.0.1:5432/test);
// -mysql DSN (default root@tcp(127.0.0.1:3306)/).
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/sqlitestore"
)

type config struct {
	stores            []string
	duration, sample  time.Duration
	killEvery, retain time.Duration
	clients, dup      int
	pg, my            string
	bin               string
}

func main() {
	var cfg config
	var stores string
	flag.StringVar(&stores, "stores", "sqlite,postgres,mysql", "stores to soak, in turn")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Minute, "how long each store runs")
	flag.DurationVar(&cfg.sample, "sample", 30*time.Second, "sampling interval")
	flag.DurationVar(&cfg.killEvery, "kill-every", time.Minute, "SIGKILL and restart the second instance this often")
	flag.DurationVar(&cfg.retain, "retention", time.Minute, "the example's -retention")
	flag.IntVar(&cfg.clients, "clients", 8, "concurrent clients")
	flag.IntVar(&cfg.dup, "dup", 30, "percent of requests that retry a recent key")
	flag.StringVar(&cfg.pg, "pg", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL server")
	flag.StringVar(&cfg.my, "mysql", "root@tcp(127.0.0.1:3306)/", "MySQL/MariaDB server (go-sql-driver DSN)")
	flag.Parse()
	cfg.stores = strings.Split(stores, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	dir, err := os.MkdirTemp("", "idem-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.bin = filepath.Join(dir, "payments")
	build := exec.CommandContext(ctx, "go", "build", "-o", cfg.bin, "./examples/payments")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build examples/payments (run from the repository root): %w", err)
	}
	for _, s := range cfg.stores {
		db, err := prepare(ctx, cfg, s, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		err = soak(ctx, cfg, db)
		db.drop()
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// database is one store's database, as the example and the sampler see it.
type database struct {
	name   string
	dsn    string  // the example's -dsn
	sql    *sql.DB // the sampler's connection
	tables []string
	conns  string // query counting the database's connections ("" for SQLite)
	drop   func()
}

func prepare(ctx context.Context, cfg config, store, dir string) (*database, error) {
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	switch store {
	case "sqlite":
		path := filepath.Join(dir, "soak.db")
		db, err := sqlitestore.OpenDB(ctx, path)
		if err != nil {
			return nil, err
		}
		return &database{name: "SQLite", dsn: "sqlite://" + path, sql: db,
			tables: []string{"idem_records", "idem_records_steps", "payments"},
			drop:   func() { db.Close() }}, nil
	case "postgres":
		db, err := sql.Open("pgx", cfg.pg)
		if err != nil {
			return nil, err
		}
		schema := "soak_" + suffix
		if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
			db.Close()
			return nil, err
		}
		sep := "?"
		if strings.Contains(cfg.pg, "?") {
			sep = "&"
		}
		return &database{name: "PostgreSQL", dsn: cfg.pg + sep + "search_path=" + schema, sql: db,
			tables: []string{schema + ".idem_records", schema + ".idem_records_steps", schema + ".payments"},
			conns:  "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
			drop: func() {
				_, _ = db.Exec("DROP SCHEMA " + schema + " CASCADE")
				db.Close()
			}}, nil
	case "mysql":
		mc, err := mysql.ParseDSN(cfg.my)
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("mysql", mc.FormatDSN())
		if err != nil {
			return nil, err
		}
		name := "soak_" + suffix
		if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			db.Close()
			return nil, err
		}
		pass := ""
		if mc.Passwd != "" {
			pass = ":" + mc.Passwd
		}
		return &database{name: "MariaDB", dsn: "mysql://" + mc.User + pass + "@" + mc.Addr + "/" + name, sql: db,
			tables: []string{name + ".idem_records", name + ".payments"},
			conns:  "SELECT count(*) FROM information_schema.processlist WHERE db = '" + name + "'",
			drop: func() {
				_, _ = db.Exec("DROP DATABASE " + name)
				db.Close()
			}}, nil
	}
	return nil, fmt.Errorf("unknown store %q (sqlite, postgres, mysql)", store)
}

// instance is one running examples/payments.
type instance struct {
	cmd         *exec.Cmd
	base, debug string
	exited      chan struct{}
}

func start(ctx context.Context, cfg config, db *database) (*instance, error) {
	cmd := exec.Command(cfg.bin, "-addr", "127.0.0.1:0", "-debug-addr", "127.0.0.1:0", "-log", "json",
		"-dsn", db.dsn, "-lease", "2s", "-retention", cfg.retain.String(), "-provider-latency", "2ms",
		"-completer-interval", "1s", "-completer-after", "0s")
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	in := &instance{cmd: cmd, exited: make(chan struct{})}
	addrs := make(chan [2]string, 2)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Addr != "" {
				addrs <- [2]string{line.Msg, line.Addr}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() { _ = cmd.Wait(); close(in.exited) }()
	for in.base == "" || in.debug == "" {
		select {
		case a := <-addrs:
			if a[0] == "listening" {
				in.base = "http://" + a[1]
			} else {
				in.debug = "http://" + a[1]
			}
		case <-in.exited:
			return nil, errors.New("examples/payments exited at start")
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			return nil, errors.New("examples/payments did not start")
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return nil, ctx.Err()
		}
	}
	return in, nil
}

func (in *instance) kill() {
	_ = in.cmd.Process.Kill()
	<-in.exited
}

// sample is one row of the report.
type sample struct {
	at                         time.Duration
	rps                        float64
	rss, heap, goroutines, fds int64
	conns                      int64
	rows                       []int64
	errs                       int64
}

func soak(ctx context.Context, cfg config, db *database) error {
	a, err := start(ctx, cfg, db)
	if err != nil {
		return err
	}
	defer a.kill()
	b, err := start(ctx, cfg, db)
	if err != nil {
		return err
	}
	var bMu sync.Mutex
	defer func() { bMu.Lock(); b.kill(); bMu.Unlock() }()
	target := func(i int) string {
		if i%2 == 0 {
			return a.base
		}
		bMu.Lock()
		defer bMu.Unlock()
		return b.base
	}

	ctx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	// done: requests answered 201; failed: other answers and transport
	// errors; keys: new keys that got their 201; gaveUp: new keys whose
	// client gave up after a failure (one in four at once: the completer's
	// case). Every payment is one of those keys, each booked at most once:
	// keys <= ledger rows <= keys + gaveUp.
	var done, failed, keys, gaveUp atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for c := range cfg.clients {
		wg.Go(func() {
			user := fmt.Sprintf("soak-%d", c)
			var recent []string // keys whose first request got its 201
			post := func(key string, n int) bool {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target(n)+"/v1/payments",
					strings.NewReader(`{"amount":1000,"currency":"JPY","to":"alice"}`))
				req.Header.Set("X-User-ID", user)
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("Content-Type", "application/json")
				return send(client, req, &done, &failed)
			}
			for n := 0; ctx.Err() == nil; n++ {
				if len(recent) > 0 && rand.IntN(100) < cfg.dup {
					post(recent[rand.IntN(len(recent))], n)
					continue
				}
				key := fmt.Sprintf("k-%d-%d", c, n)
				ok := post(key, n)
				if !ok && rand.IntN(4) == 0 {
					// The client gives up after a failure (the killed
					// instance's request): the completer's case.
					gaveUp.Add(1)
					continue
				}
				for try := 1; !ok && try <= 50 && ctx.Err() == nil; try++ {
					time.Sleep(100 * time.Millisecond) // a client's retry delay
					ok = post(key, n+try)
				}
				if !ok {
					gaveUp.Add(1)
					continue
				}
				keys.Add(1)
				if recent = append(recent, key); len(recent) > 64 {
					recent = recent[1:]
				}
			}
		})
	}
	wg.Go(func() { // the killer
		t := time.NewTicker(cfg.killEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			bMu.Lock()
			b.kill()
			nb, err := start(context.WithoutCancel(ctx), cfg, db)
			if err == nil {
				b = nb
			} else {
				fmt.Fprintln(os.Stderr, "soak: restart:", err)
			}
			bMu.Unlock()
		}
	})

	fmt.Printf("\n%s, %v, %d clients, %d%% duplicates, second instance killed every %v, retention %v\n\n",
		db.name, cfg.duration, cfg.clients, cfg.dup, cfg.killEvery, cfg.retain)
	fmt.Fprintf(os.Stderr, "soak: the sampled instance's profiles: %s/debug/pprof/\n", a.debug)
	fmt.Printf("| min | req/s | RSS MiB | live heap MiB | goroutines | fds | db conns | %s | non-201 |\n", strings.Join(short(db.tables), " | "))
	fmt.Printf("|---:|---:|---:|---:|---:|---:|---:|%s---:|\n", strings.Repeat("---:|", len(db.tables)))
	var samples []sample
	began, last, lastDone := time.Now(), time.Now(), int64(0)
	tick := time.NewTicker(cfg.sample)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			s := take(context.WithoutCancel(ctx), a, db)
			now := time.Now()
			d := done.Load()
			s.at, s.rps, s.errs = now.Sub(began), float64(d-lastDone)/now.Sub(last).Seconds(), failed.Swap(0)
			last, lastDone = now, d
			samples = append(samples, s)
			fmt.Printf("| %.1f | %.0f | %.1f | %.1f | %d | %d | %d | %s | %d |\n", s.at.Minutes(), s.rps,
				mib(s.rss), mib(s.heap), s.goroutines, s.fds, s.conns, joinInts(s.rows), s.errs)
		}
	}
	wg.Wait()
	report(samples, db)
	// The last orphans: the completer books them within a lease and an
	// interval of its own (1s) after they stalled.
	bMu.Lock()
	b.kill()
	bMu.Unlock()
	time.Sleep(10 * time.Second) // a bounded settle: lease 2s + completer interval 1s, with margin
	var rows int64
	if err := db.sql.QueryRow("SELECT count(*) FROM " + db.tables[len(db.tables)-1]).Scan(&rows); err != nil {
		return fmt.Errorf("count the ledger: %w", err)
	}
	k, g := keys.Load(), gaveUp.Load()
	fmt.Printf("Payments: %d keys answered 201, %d given up by their client, %d ledger rows (want %d..%d).\n", k, g, rows, k, k+g)
	if rows < k || rows > k+g {
		return fmt.Errorf("ledger %d rows outside [%d, %d]: a payment was lost or doubled", rows, k, k+g)
	}
	return nil
}

// send makes one request and counts its answer; it reports a 201.
func send(client *http.Client, req *http.Request, done, failed *atomic.Int64) bool {
	resp, err := client.Do(req)
	if err != nil {
		if req.Context().Err() == nil {
			failed.Add(1) // the killed instance's requests
		}
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusCreated {
		done.Add(1)
		return true
	}
	failed.Add(1) // 409 in flight, 5xx from a killed owner
	return false
}

// take samples the surviving instance a and the database.
func take(ctx context.Context, a *instance, db *database) sample {
	var s sample
	pid := a.cmd.Process.Pid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				s.rss = kb << 10
			}
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.fds = int64(len(ents))
	}
	if resp, err := http.Get(a.debug + "/debug/vars"); err == nil {
		var v struct {
			Goroutines int64
			HeapLive   int64 `json:"heap_live"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		s.heap, s.goroutines = v.HeapLive, v.Goroutines
	}
	if db.conns != "" {
		_ = db.sql.QueryRowContext(ctx, db.conns).Scan(&s.conns)
	}
	for _, t := range db.tables {
		var n int64
		_ = db.sql.QueryRowContext(ctx, "SELECT count(*) FROM "+t).Scan(&n)
		s.rows = append(s.rows, n)
	}
	return s
}

// report prints the growth from minute 2 to the end.
func report(samples []sample, db *database) {
	var from *sample
	for i := range samples {
		if samples[i].at >= 2*time.Minute {
			from = &samples[i]
			break
		}
	}
	if from == nil || len(samples) == 0 {
		fmt.Println("\n(too short for a growth figure: run 3 minutes or more)")
		return
	}
	to := samples[len(samples)-1]
	var maxIdem int64
	for _, s := range samples {
		maxIdem = max(maxIdem, s.rows[0])
	}
	fmt.Printf("\nFrom minute %.1f to %.1f: RSS %+.1f MiB, heap %+.1f MiB, goroutines %+d, fds %+d, db conns %+d; req/s %.0f -> %.0f; %s rows at most %d.\n",
		from.at.Minutes(), to.at.Minutes(), mib(to.rss-from.rss), mib(to.heap-from.heap), to.goroutines-from.goroutines,
		to.fds-from.fds, to.conns-from.conns, from.rps, to.rps, short(db.tables)[0], maxIdem)
}

func short(tables []string) []string {
	out := make([]string, len(tables))
	for i, t := range tables {
		out[i] = t[strings.LastIndexByte(t, '.')+1:]
	}
	return out
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func joinInts(v []int64) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(s, " | ")
}
