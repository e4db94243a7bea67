package pgstore_test

// Database outages, simulated per test: the store's pool reaches PostgreSQL
// through a TCP proxy on 127.0.0.1 that the test cuts (every connection
// closed, new ones refused) and restores, and backends are killed with
// pg_terminate_backend. The machine's PostgreSQL server is never stopped:
// other packages' tests run against it in parallel.
//
// What must hold: while the database is unreachable, requests are answered
// 503 store-unavailable and no handler runs without a claim; a handler
// whose commit failed is never reported as a success; after the database
// comes back, service resumes without intervention, and a key whose commit
// failed runs again after its lease and is then committed exactly once.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// outageProxy forwards TCP connections to PostgreSQL until cut.
type outageProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newOutageProxy(t *testing.T, target string) *outageProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &outageProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *outageProxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

func (p *outageProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close() // refused: the client sees the connection drop at once
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

func (p *outageProxy) serve(c net.Conn) {
	defer p.wg.Done()
	u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		u.Close()
		p.drop(c)
		return
	}
	p.conns[u] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
	p.drop(c)
	p.drop(u)
	<-done
}

func (p *outageProxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// Cut closes every connection and refuses new ones until Restore.
func (p *outageProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *outageProxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *outageProxy) close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

// outageEnv is a payments-like service: POST /pay books a ledger row for
// the key and calls a deduplicating fake provider with the relay key. In
// transactional mode the row is written in pgstore.Tx.
type outageEnv struct {
	t       *testing.T
	admin   *pgxpool.Pool // direct, never cut
	pool    *pgxpool.Pool // through the proxy
	proxy   *outageProxy
	schema  string
	app     string // application_name of the proxied pool's backends
	url     string
	client  *http.Client
	logs    *idemtest.LogBuffer
	ledger  string // quoted table
	records string // quoted table

	// gate, when set for a key, holds its handler after the ledger write
	// until closed; entered is signalled when it gets there.
	mu      sync.Mutex
	gates   map[string]chan struct{}
	entered map[string]chan struct{}
	runs    map[string]int

	provMu  sync.Mutex
	charges map[string]int      // relay key -> charges made (deduplicated)
	calls   map[string]int      // relay key -> calls
	relays  map[string][]string // user|key -> relay key of each run
}

func outageRandom(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func newOutageEnv(t *testing.T, transactional bool, lease time.Duration) *outageEnv {
	t.Helper()
	acfg := pgstoretest.Config(t)
	acfg.MaxConns = 2 // direct: setup, terminations and checks only
	admin := pgstoretest.NewPool(t, acfg)
	schema := pgstoretest.Schema(t, admin)
	env := &outageEnv{
		t: t, admin: admin, schema: schema, app: "idem_outage_" + outageRandom(t),
		logs:    &idemtest.LogBuffer{},
		gates:   map[string]chan struct{}{},
		entered: map[string]chan struct{}{},
		runs:    map[string]int{},
		charges: map[string]int{},
		calls:   map[string]int{},
		relays:  map[string][]string{},
		ledger:  pgx.Identifier{schema, "ledger"}.Sanitize(),
		records: pgx.Identifier{schema, "idem_records"}.Sanitize(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.Exec(ctx, `CREATE TABLE `+env.ledger+` (scope text NOT NULL, key text NOT NULL, run int NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	cfg := pgstoretest.Config(t)
	env.proxy = newOutageProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = env.proxy.port()
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.ConnConfig.RuntimeParams["application_name"] = env.app
	cfg.MaxConns = 4
	cfg.HealthCheckPeriod = 200 * time.Millisecond
	env.pool = pgstoretest.NewPool(t, cfg)

	opts := []pgstore.Option{pgstore.WithSchema(schema)}
	if err := pgstore.Migrate(ctx, env.pool, opts...); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	store, err := pgstore.New(env.pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	logger := slog.New(slog.NewJSONHandler(env.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	eng, err := core.New(store, core.WithLease(lease), core.WithCommitTimeout(3*time.Second), core.WithLogger(logger), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		user := r.Header.Get("X-User-ID")
		key, _ := core.KeyFromContext(ctx)
		env.mu.Lock()
		env.runs[user+"|"+key]++
		run := env.runs[user+"|"+key]
		gate, entered := env.gates[key], env.entered[key]
		delete(env.gates, key) // only the first run is held
		delete(env.entered, key)
		env.mu.Unlock()

		relay := core.RelayKey(ctx, "charge")
		env.provMu.Lock()
		env.relays[user+"|"+key] = append(env.relays[user+"|"+key], relay)
		env.provMu.Unlock()
		charge := env.charge(relay)
		var err error
		if transactional {
			var tx pgx.Tx
			if tx, err = pgstore.Tx(ctx); err == nil {
				_, err = tx.Exec(ctx, `INSERT INTO `+env.ledger+` VALUES ($1, $2, $3)`, user, key, run)
			}
		} else {
			_, err = env.pool.Exec(ctx, `INSERT INTO `+env.ledger+` VALUES ($1, $2, $3)`, user, key, run)
		}
		if err != nil {
			http.Error(w, "ledger write failed", http.StatusInternalServerError)
			return
		}
		if gate != nil {
			close(entered)
			<-gate
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%q,"charge":%q}`, key, charge)
	})
	mux := http.NewServeMux()
	mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		return r.Header.Get("X-User-ID"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("POST /pay", mw(h))
	srv := httptest.NewServer(mux)
	tr := &http.Transport{MaxIdleConnsPerHost: 32} // concurrent duplicates: keep their connections (the default keeps 2)
	env.client = &http.Client{Transport: tr, Timeout: 15 * time.Second}
	env.url = srv.URL
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return env
}

// charge is the fake provider: deduplicates on the relay key, as Stripe does.
func (e *outageEnv) charge(relay string) string {
	e.provMu.Lock()
	defer e.provMu.Unlock()
	e.calls[relay]++
	if e.charges[relay] == 0 {
		e.charges[relay] = 1
	}
	return "ch_" + relay[len(relay)-8:]
}

func (e *outageEnv) gate(key string) (release chan struct{}, entered chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	release, entered = make(chan struct{}), make(chan struct{})
	e.gates[key], e.entered[key] = release, entered
	return release, entered
}

func (e *outageEnv) runsOf(user, key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[user+"|"+key]
}

func (e *outageEnv) totalRuns() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, r := range e.runs {
		n += r
	}
	return n
}

type outageResp struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (r outageResp) problem() string {
	var p problem.Details
	if json.Unmarshal(r.body, &p) != nil {
		return ""
	}
	return strings.TrimPrefix(p.Type, problem.BaseURI)
}

func (e *outageEnv) post(user, key string) outageResp {
	req, err := http.NewRequest(http.MethodPost, e.url+"/pay", strings.NewReader(`{"amount":100}`))
	if err != nil {
		return outageResp{err: err}
	}
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	resp, err := e.client.Do(req)
	if err != nil {
		return outageResp{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return outageResp{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// ledgerRows counts committed ledger rows for (user, key), read directly.
func (e *outageEnv) ledgerRows(user, key string) int {
	e.t.Helper()
	var n int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.admin.QueryRow(ctx, `SELECT count(*) FROM `+e.ledger+` WHERE scope = $1 AND key = $2`, user, key).Scan(&n); err != nil {
		e.t.Fatalf("count ledger rows: %v", err)
	}
	return n
}

// record reads (status, locked_until in the past) for (user, key) directly.
func (e *outageEnv) record(user, key string) (status string, lapsed bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := e.admin.QueryRow(ctx, `SELECT status, locked_until < now() FROM `+e.records+` WHERE scope = $1 AND key = $2`, user, key).Scan(&status, &lapsed)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false
	}
	if err != nil {
		e.t.Fatalf("read record: %v", err)
	}
	return status, lapsed
}

// untilCreated retries (user, key) until 201 or the deadline, sleeping
// between attempts; it returns every status seen.
func (e *outageEnv) untilCreated(user, key string, within time.Duration) (outageResp, []int) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	var seen []int
	for {
		r := e.post(user, key)
		seen = append(seen, r.status)
		if r.err == nil && r.status == http.StatusCreated {
			return r, seen
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s/%s: no 201 within %v; statuses %v, last %s %v", user, key, within, seen, r.body, r.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkNoKeysInLogs: pg errors (unique violations name the row) must not
// smuggle keys past the engine's redaction.
func (e *outageEnv) checkNoKeysInLogs(keys ...string) {
	e.t.Helper()
	out := e.logs.String()
	if !strings.Contains(out, "store_error") {
		e.t.Errorf("no store_error logged during the outage; logs:\n%s", out)
	}
	for _, k := range keys {
		if strings.Contains(out, k) {
			e.t.Errorf("key %q appears in the logs", k)
		}
	}
}

func TestOutageProxyCut(t *testing.T) {
	for _, transactional := range []bool{true, false} {
		t.Run(map[bool]string{true: "tx", false: "non-tx"}[transactional], func(t *testing.T) {
			testOutageProxyCut(t, transactional)
		})
	}
}

func testOutageProxyCut(t *testing.T, transactional bool) {
	const lease = time.Second
	env := newOutageEnv(t, transactional, lease)
	sfx := "-" + outageRandom(t)
	key := func(s string) string { return s + sfx }

	// Healthy.
	for i := range 3 {
		if r := env.post("u", key("before-"+strconv.Itoa(i))); r.status != 201 {
			t.Fatalf("before the outage: %d %s %v", r.status, r.body, r.err)
		}
	}

	// A request in its handler when the database goes away: its ledger
	// write is done (in its transaction, in tx mode), then the cut.
	release, entered := env.gate(key("mid"))
	midDone := make(chan outageResp, 1)
	go func() { midDone <- env.post("u", key("mid")) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("mid-request handler never started")
	}
	env.proxy.Cut()
	cutAt := time.Now()

	// During the outage: 503 problems, no handler runs.
	runsBefore := env.totalRuns()
	for i := range 10 {
		r := env.post("u", key("during-"+strconv.Itoa(i)))
		if r.err != nil || r.status != 503 || r.problem() != problem.StoreUnavailable || r.header.Get("Retry-After") == "" {
			t.Errorf("during the outage: %d %q %s %v", r.status, r.header.Get("Retry-After"), r.body, r.err)
		}
	}
	// A replay of a completed key needs the store too: 503, not a re-run.
	if r := env.post("u", key("before-0")); r.status != 503 {
		t.Errorf("replay during the outage: %d %s", r.status, r.body)
	}
	if n := env.totalRuns() - runsBefore; n != 0 {
		t.Errorf("%d handlers ran during the outage without a claim", n)
	}
	if took := time.Since(cutAt); took > 5*time.Second {
		t.Errorf("11 requests during the outage took %v: they must fail fast", took)
	}

	// The mid-request handler finishes: its commit cannot be recorded, so
	// the client must not get the 201.
	close(release)
	mid := <-midDone
	if mid.err != nil || mid.status != 503 || mid.problem() != problem.StoreUnavailable {
		t.Fatalf("handler finishing during the outage: %d %s %v (want 503: its outcome was not recorded)", mid.status, mid.body, mid.err)
	}
	if transactional && env.ledgerRows("u", key("mid")) != 0 {
		t.Errorf("tx mode: the uncommitted ledger row of the mid request is visible")
	}

	// Restore: service resumes without intervention.
	time.Sleep(300 * time.Millisecond) // still down a little longer
	env.proxy.Restore()
	restoredAt := time.Now()
	// A connection that died with the cut may still sit idle in the pool:
	// the request that draws it fails once (503, or 500 when it was the
	// handler's transaction) and the pool drops it. There are at most
	// MaxConns of them; after that every request succeeds.
	failedAttempts := 0
	checkOnce := func(k string, seen []int) {
		t.Helper()
		for _, s := range seen[:len(seen)-1] {
			if s != 500 && s != 503 {
				t.Errorf("%s: attempt answered %d before its 201", k, s)
			}
		}
		failedAttempts += len(seen) - 1
		runs, rows := env.runsOf("u", k), env.ledgerRows("u", k)
		if runs < 1 || runs > len(seen) {
			t.Errorf("%s: %d runs for %d attempts", k, runs, len(seen))
		}
		if (transactional && rows != 1) || rows < 1 {
			t.Errorf("%s: %d ledger rows (transactional %v)", k, rows, transactional)
		}
	}
	for i := range 5 {
		k := key("after-" + strconv.Itoa(i))
		r, seen := env.untilCreated("u", k, 10*time.Second)
		if r.header.Get(core.ReplayedHeader) != "" {
			t.Errorf("%s: a new key was replayed", k)
		}
		checkOnce(k, seen)
	}
	t.Logf("first 5 new keys created %v after restore, %d failed attempts on dead pooled connections", time.Since(restoredAt), failedAttempts)
	// Keys refused during the outage were never claimed: they run now.
	for i := range 10 {
		k := key("during-" + strconv.Itoa(i))
		_, seen := env.untilCreated("u", k, 10*time.Second)
		checkOnce(k, seen)
	}
	if failedAttempts > 4 {
		t.Errorf("%d failed attempts after the database came back; the pool holds at most 4 dead connections", failedAttempts)
	}
	// Completed keys replay; they did not run again.
	if r := env.post("u", key("before-0")); r.status != 201 || r.header.Get(core.ReplayedHeader) != "true" || env.runsOf("u", key("before-0")) != 1 {
		t.Errorf("replay after the outage: %d %v", r.status, r.header)
	}

	// The mid key: its record is still processing (the fail could not be
	// written either) until its lease lapses; then a retry takes it over and
	// it is committed exactly once.
	status, _ := env.record("u", key("mid"))
	if status != "processing" && status != "failed" {
		t.Errorf("mid record status %q after the outage", status)
	}
	first := env.post("u", key("mid"))
	if first.status != 201 && first.status != 409 && first.status != 503 && first.status != 500 {
		t.Errorf("mid retry right after restore: %d %s", first.status, first.body)
	}
	r := first
	seen := []int{first.status}
	if first.status != 201 {
		var more []int
		r, more = env.untilCreated("u", key("mid"), 10*lease)
		seen = append(seen, more...)
	}
	t.Logf("mid key: record %s after restore, then statuses %v", status, seen)
	// The first 201 is the takeover's own answer, not a replay: nothing of
	// the failed commit was recorded.
	if r.header.Get(core.ReplayedHeader) == "true" {
		t.Errorf("mid key: the first 201 is a replay, but its first commit failed")
	}
	// Two runs: the one whose commit failed, then the takeover (plus one
	// per attempt that failed on a dead pooled connection in its handler).
	midRuns := env.runsOf("u", key("mid"))
	if midRuns < 2 || midRuns > 1+len(seen) {
		t.Errorf("mid key ran %d times after %d attempts, want 2", midRuns, len(seen))
	}
	if rows := env.ledgerRows("u", key("mid")); transactional && rows != 1 {
		t.Errorf("tx mode: mid key has %d ledger rows, want exactly 1", rows)
	} else if !transactional && rows != 2 {
		// Non-transactional: the first run's write could not be undone;
		// this is the documented limit the relay key exists for.
		t.Logf("non-tx mode: mid key has %d ledger rows (first run's write was not rolled back)", rows)
	}
	// Either way the provider charged once: the relay key is the second wall.
	// Every run of the one record sent the same relay key (the takeover
	// included), so the provider deduplicated them.
	env.provMu.Lock()
	relays := env.relays["u|"+key("mid")]
	var calls, charges int
	if len(relays) > 0 {
		calls, charges = env.calls[relays[0]], env.charges[relays[0]]
	}
	env.provMu.Unlock()
	for i, rk := range relays {
		if rk != relays[0] {
			t.Errorf("mid key: run %d relayed another key than run 1 (a takeover of one record must relay the same key)", i+1)
		}
	}
	if calls != midRuns || charges != 1 {
		t.Errorf("mid key: provider called %d times, charged %d; want %d calls, 1 charge", calls, charges, midRuns)
	}
	if again := env.post("u", key("mid")); again.header.Get(core.ReplayedHeader) != "true" || !bytes.Equal(again.body, r.body) {
		t.Errorf("mid key replay: %d %s", again.status, again.body)
	}
	env.checkNoKeysInLogs(key("mid"), key("during-0"), key("before-0"))
}

// terminate kills up to limit backends of the proxied pool, chosen at
// random (not the admin pool's, not other tests'). It returns how many it
// killed.
func (e *outageEnv) terminate(limit int) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	err := e.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
	SELECT pid FROM pg_stat_activity
	WHERE application_name = $1 AND datname = current_database() AND pid <> pg_backend_pid()
	ORDER BY random() LIMIT $2) victims`, e.app, limit).Scan(&n)
	if err != nil {
		e.t.Errorf("terminate backends: %v", err)
	}
	return n
}

// TestOutageTerminateBackendMidRequest kills the pool's backends while a
// handler holds its transaction: the client gets a clear error, never a
// 201 that was not recorded, and the key is then committed exactly once.
func TestOutageTerminateBackendMidRequest(t *testing.T) {
	const lease = time.Second
	env := newOutageEnv(t, true, lease)
	k := "term-" + outageRandom(t)
	release, entered := env.gate(k)
	done := make(chan outageResp, 1)
	go func() { done <- env.post("u", k) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never started")
	}
	if n := env.terminate(100); n == 0 {
		t.Fatal("no backend terminated: the test did not exercise anything")
	}
	close(release)
	r := <-done
	if r.err != nil || r.status == 201 || (r.status != 503 && r.status != 409) {
		t.Fatalf("after its backend was terminated: %d %s %v (want a 503/409 problem, not a success)", r.status, r.body, r.err)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	if env.ledgerRows("u", k) != 0 {
		t.Fatalf("the terminated transaction's row is visible")
	}
	got, seen := env.untilCreated("u", k, 10*lease)
	t.Logf("after termination: %d %s, then %v", r.status, r.problem(), seen)
	if env.ledgerRows("u", k) != 1 || env.runsOf("u", k) != 2 {
		t.Errorf("%d ledger rows, %d runs; want 1 row from the second run", env.ledgerRows("u", k), env.runsOf("u", k))
	}
	if again := env.post("u", k); !bytes.Equal(again.body, got.body) || again.header.Get(core.ReplayedHeader) != "true" {
		t.Errorf("replay: %d %s", again.status, again.body)
	}
}

// TestOutageTerminateBackendsUnderLoad terminates a random backend of the
// pool every 120ms while 20 clients push 40 keys (a third sent twice at
// once), retrying until 201. Every answer is a 201 or a clear problem;
// every key ends with exactly one ledger row; nothing stays processing.
// The first key's handler is held until a backend has been terminated, so
// the load cannot finish before the first termination however fast it is.
func TestOutageTerminateBackendsUnderLoad(t *testing.T) {
	const lease = 500 * time.Millisecond
	env := newOutageEnv(t, true, lease)
	sfx := "-" + outageRandom(t)
	const keys = 40

	stop := make(chan struct{})
	var killers sync.WaitGroup
	var terminated atomic.Int64
	killers.Go(func() {
		tick := time.NewTicker(120 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				terminated.Add(int64(env.terminate(1)))
			}
		}
	})

	first := "load-0" + sfx
	release, _ := env.gate(first)
	killers.Go(func() {
		defer close(release)
		for terminated.Load() == 0 {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})

	var mu sync.Mutex
	statuses := map[int]int{}
	bodies := map[string][]byte{}
	jobs := make(chan string)
	var wg sync.WaitGroup
	deadline := time.Now().Add(60 * time.Second)
	send := func(k string) {
		for {
			r := env.post("u", k)
			mu.Lock()
			statuses[r.status]++
			if r.status == 201 {
				if prev, ok := bodies[k]; ok && !bytes.Equal(prev, r.body) {
					t.Errorf("%s: two different 201 bodies: %s vs %s", k, prev, r.body)
				}
				bodies[k] = r.body
			}
			mu.Unlock()
			switch {
			case r.err != nil:
				t.Errorf("%s: transport error %v", k, r.err)
				return
			case r.status == 201:
				return
			case r.status == 409 && (r.problem() == problem.InFlight),
				r.status == 503 && r.problem() == problem.StoreUnavailable,
				r.status == 500 && bytes.Contains(r.body, []byte("ledger write failed")):
			default:
				t.Errorf("%s: unexpected answer %d %s", k, r.status, r.body)
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: no 201 before the deadline; last %d %s", k, r.status, r.body)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for range 20 {
		wg.Go(func() {
			for k := range jobs {
				send(k)
			}
		})
	}
	for i := range keys {
		k := "load-" + strconv.Itoa(i) + sfx
		if i%3 == 0 {
			wg.Go(func() { send(k) }) // a concurrent duplicate
		}
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	close(stop)
	killers.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rows, distinct, processing int
	if err := env.admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM `+env.ledger).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := env.admin.QueryRow(ctx, `SELECT count(*) FROM `+env.records+` WHERE status <> 'completed'`).Scan(&processing); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys, %d backends terminated, statuses %v, %d handler runs, %d ledger rows", keys, terminated.Load(), statuses, env.totalRuns(), rows)
	if rows != keys || distinct != keys {
		t.Errorf("%d ledger rows for %d distinct keys; want exactly one per key (%d)", rows, distinct, keys)
	}
	if processing != 0 {
		t.Errorf("%d records not completed after every key got its 201", processing)
	}
	if terminated.Load() == 0 {
		t.Errorf("no backend was terminated: the test exercised nothing")
	}
	if t.Failed() {
		out := env.logs.String()
		t.Logf("logs (tail):\n%s", out[max(0, len(out)-4000):])
	}
}
