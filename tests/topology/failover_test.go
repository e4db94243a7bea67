package topology

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// cluster is a private primary and a streaming standby on loopback.
type cluster struct {
	dir                    string
	primary, standby       string // data directories
	primaryPort, stdbyPort int
}

func (c *cluster) pgctl(t *testing.T, dataDir string, args ...string) string {
	t.Helper()
	return run(t, asPostgres(pgBin(t, "pg_ctl"), append([]string{"-D", dataDir}, args...)...))
}

// newCluster initdb's a primary, pg_basebackup's a standby from it and
// starts both, the standby streaming (synchronously when sync).
func newCluster(t *testing.T, primaryPort, standbyPort int, sync bool) *cluster {
	t.Helper()
	dir := ownedDir(t)
	c := &cluster{dir: dir, primary: filepath.Join(dir, "primary"), standby: filepath.Join(dir, "standby"),
		primaryPort: primaryPort, stdbyPort: standbyPort}
	run(t, asPostgres(pgBin(t, "initdb"), "-D", c.primary, "-U", "postgres", "--auth=trust", "-N"))
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
wal_level = replica
max_wal_senders = 5
hot_standby = on
shared_buffers = 32MB
fsync = on
synchronous_commit = on
`, primaryPort, dir)
	if sync {
		conf += "synchronous_standby_names = 'standby1'\n"
	}
	appendFile(t, filepath.Join(c.primary, "postgresql.conf"), conf)
	t.Cleanup(func() {
		for _, d := range []string{c.standby, c.primary} {
			_ = asPostgres(pgBin(t, "pg_ctl"), "-D", d, "stop", "-m", "immediate").Run()
		}
	})
	c.pgctl(t, c.primary, "-l", filepath.Join(dir, "primary.log"), "-w", "-t", "60", "start")
	run(t, asPostgres(pgBin(t, "pg_basebackup"), "-h", "127.0.0.1", "-p", fmt.Sprint(primaryPort), "-U", "postgres",
		"-D", c.standby, "-X", "stream", "-R", "-c", "fast"))
	// The standby inherits the primary's postgresql.conf. Once promoted it
	// has no standby of its own, so it must not wait for one: left at
	// 'standby1', every commit on the new primary blocks for ever (the
	// first run of this test hung exactly so). A failover manager
	// (Patroni, pg_auto_failover) rewrites this setting at promotion.
	appendFile(t, filepath.Join(c.standby, "postgresql.auto.conf"), fmt.Sprintf(
		"port = %d\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=standby1'\nsynchronous_standby_names = ''\n",
		standbyPort, primaryPort))
	c.pgctl(t, c.standby, "-l", filepath.Join(dir, "standby.log"), "-w", "-t", "60", "start")

	// Wait until the primary sees the standby streaming (and in sync).
	conn := connect(t, primaryPort)
	defer conn.Close(context.Background())
	want := "async"
	if sync {
		want = "sync"
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		var state string
		err := conn.QueryRow(context.Background(),
			`SELECT coalesce(max(sync_state), '') FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&state)
		if err == nil && state == want {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("standby not streaming (%s) after 30s: %q %v", want, state, err)
		}
	}
	return c
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func connect(t *testing.T, port int) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", port))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// provider is an external payment provider that deduplicates by the
// relayed Idempotency-Key (as real ones do) and counts the calls per key:
// a key called more than once was executed again by idem.
type provider struct {
	mu    sync.Mutex
	calls map[string]int
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.calls[key]++
	p.mu.Unlock()
	time.Sleep(30 * time.Millisecond)
	sum := sha256.Sum256([]byte(key))
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"ch_%s"}`, hex.EncodeToString(sum[:12]))
}

func (p *provider) reexecuted() (keys, calls int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.calls {
		calls += n
		if n > 1 {
			keys++
		}
	}
	return keys, calls
}

// TestFailover: two examples/payments instances on a multi-host DSN with
// target_session_attrs=read-write, under duplicate load; the primary is
// crashed (pg_ctl stop -m immediate) and the standby promoted mid-run.
// Every key ends with one ledger row, identical answers and replays, and
// nothing stuck; synchronous and asynchronous replication.
func TestFailover(t *testing.T) {
	requireTopology(t, "test-failover")
	bin := buildPayments(t, t.TempDir())
	for _, c := range []struct {
		name   string
		sync   bool
		p1, p2 int
	}{{"synchronous", true, 15910, 15911}, {"asynchronous", false, 15912, 15913}} {
		t.Run(c.name, func(t *testing.T) { testFailover(t, bin, c.sync, c.p1, c.p2) })
	}
}

func testFailover(t *testing.T, bin string, syncRep bool, p1, p2 int) {
	cl := newCluster(t, p1, p2, syncRep)
	prov := &provider{calls: map[string]int{}}
	ps := httptest.NewServer(prov)
	defer ps.Close()
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write&connect_timeout=2&pool_max_conns=16", p1, p2)
	var servers []*server
	for range 2 {
		servers = append(servers, startPayments(t, bin, "-dsn", dsn, "-provider-url", ps.URL, "-lease", "2s"))
	}

	const (
		workers  = 12
		maxKeys  = 3000
		runFor   = 7 * time.Second
		crashAt  = 2500 * time.Millisecond
		promoteA = 700 * time.Millisecond // after the crash
	)
	var (
		requests, unavailable, conflicts, errs atomic.Int64
		nextKey                                atomic.Int64
		mu                                     sync.Mutex
		bodies                                 = map[int][][]byte{}
		firstOK                                = map[int]time.Time{}
		crashedAt                              time.Time
		recoveredAt                            atomic.Int64 // unix nanos of the first fresh 201 after the crash
	)
	start := time.Now()
	stopAt := start.Add(runFor)
	deadline := start.Add(runFor + 45*time.Second)
	var wg sync.WaitGroup
	crashed := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stopAt) {
				k := int(nextKey.Add(1))
				if k > maxKeys {
					return
				}
				user, key := fmt.Sprintf("u%d", k), fmt.Sprintf("k-%d", k)
				// The same payment through both instances at once.
				var dwg sync.WaitGroup
				for d := range 2 {
					dwg.Add(1)
					go func() {
						defer dwg.Done()
						s := servers[(w+d)%2]
						a := postUntilFinal(func() string { return s.base }, user, key, 100+k%1000, deadline, func(a answer) {
							requests.Add(1)
							switch {
							case a.err != nil:
								errs.Add(1)
							case a.status == http.StatusServiceUnavailable:
								unavailable.Add(1)
							case a.status == http.StatusConflict:
								conflicts.Add(1)
							}
						})
						if a.status != http.StatusCreated {
							t.Errorf("key %d: %d %s %v", k, a.status, a.body, a.err)
							return
						}
						select {
						case <-crashed:
							if !a.replayed {
								recoveredAt.CompareAndSwap(0, time.Now().UnixNano())
							}
						default:
						}
						mu.Lock()
						bodies[k] = append(bodies[k], a.body)
						if _, ok := firstOK[k]; !ok {
							firstOK[k] = time.Now()
						}
						mu.Unlock()
					}()
				}
				dwg.Wait()
			}
		}()
	}

	time.Sleep(crashAt)
	crashedAt = time.Now()
	cl.pgctl(t, cl.primary, "stop", "-m", "immediate")
	close(crashed)
	time.Sleep(promoteA)
	// Before promotion, the standby (read-only) shows what survived: every
	// payment acknowledged (201) before the crash must be there under
	// synchronous replication; asynchronous replication may lose the last
	// ones (their retries then run again, and the provider's deduplication
	// is the second wall).
	acked := map[string]bool{}
	mu.Lock()
	for k, at := range firstOK {
		if at.Before(crashedAt) {
			acked[fmt.Sprintf("u%d", k)] = true
		}
	}
	mu.Unlock()
	sconn := connect(t, p2)
	srows, err := sconn.Query(context.Background(), `SELECT user_id FROM payments`)
	if err != nil {
		t.Fatal(err)
	}
	for srows.Next() {
		var u string
		if err := srows.Scan(&u); err != nil {
			t.Fatal(err)
		}
		delete(acked, u)
	}
	srows.Close()
	sconn.Close(context.Background())
	lostAcked := len(acked)
	if syncRep && lostAcked > 0 {
		t.Errorf("synchronous replication lost %d payments acknowledged before the crash", lostAcked)
	}
	cl.pgctl(t, cl.standby, "promote", "-w", "-t", "60")
	promotedAt := time.Now()
	wg.Wait()
	if t.Failed() {
		return
	}

	// Every key: its answers identical, and a replay now (from the new
	// primary) identical to them.
	keys := int(min(nextKey.Load(), maxKeys))
	mu.Lock()
	defer mu.Unlock()
	var beforeCrash, differing int
	for k, bs := range bodies {
		if firstOK[k].Before(crashedAt) {
			beforeCrash++
		}
		replay := post(servers[k%2].base, fmt.Sprintf("u%d", k), fmt.Sprintf("k-%d", k), 100+k%1000)
		if replay.status != http.StatusCreated || !replay.replayed {
			t.Errorf("key %d: replay after the failover: %d replayed=%v %s", k, replay.status, replay.replayed, replay.body)
		}
		for _, b := range append(bs, replay.body) {
			if !bytes.Equal(b, bs[0]) {
				differing++
				t.Errorf("key %d: answers differ: %s vs %s", k, b, bs[0])
				break
			}
		}
	}
	if len(bodies) != keys {
		t.Errorf("%d keys answered, %d sent", len(bodies), keys)
	}

	// The new primary: one ledger row per key, nothing processing.
	conn := connect(t, p2)
	defer conn.Close(context.Background())
	var rows, users, processing int
	if err := conn.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT user_id) FROM payments`).Scan(&rows, &users); err != nil {
		t.Fatal(err)
	}
	if rows != keys || users != keys {
		t.Errorf("ledger: %d rows for %d users, want one row for each of %d keys", rows, users, keys)
	}
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM idem_records WHERE status = 'processing'`).Scan(&processing); err != nil {
		t.Fatal(err)
	}
	if processing != 0 {
		t.Errorf("%d records stuck in processing", processing)
	}
	reexec, calls := prov.reexecuted()
	recovery := "n/a"
	if r := recoveredAt.Load(); r != 0 {
		recovery = time.Unix(0, r).Sub(crashedAt).Round(10 * time.Millisecond).String()
	}
	mode := "async"
	if syncRep {
		mode = "sync"
	}
	t.Logf("failover (%s replication): %d keys (%d answered before the crash) x 2 instances; %d requests, %d 503s, %d connection errors, %d 409s (all retried); "+
		"provider calls %d, keys re-executed %d; acknowledged payments missing on the standby at promotion %d; promoted %v after the crash; first fresh 201 %s after the crash; answers differing %d",
		mode, keys, beforeCrash, requests.Load(), unavailable.Load(), errs.Load(), conflicts.Load(), calls, reexec, lostAcked,
		promotedAt.Sub(crashedAt).Round(10*time.Millisecond), recovery, differing)
}
