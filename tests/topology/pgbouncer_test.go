package topology

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgstore/pgstoretest"
)

const pgbouncerPort = "15901"

// startPgBouncer runs PgBouncer in transaction pooling in front of the test
// PostgreSQL, as the postgres OS user, config and logs in a temp dir.
func startPgBouncer(t *testing.T, direct *pgx.ConnConfig) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, err := os.Stat(bin); err != nil {
			t.Fatal("pgbouncer is not installed: apt-get install -y pgbouncer (make test-pgbouncer does)")
		}
	}
	dir := ownedDir(t)
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir =
auth_type = trust
auth_file = %s/userlist.txt
pool_mode = transaction
default_pool_size = 8
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s/pgbouncer.log
pidfile = %s/pgbouncer.pid
`, direct.Host, direct.Port, direct.User, pgbouncerPort, dir, dir, dir)
	for name, content := range map[string]string{"pgbouncer.ini": ini, "userlist.txt": fmt.Sprintf("%q \"\"\n", direct.User)} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := asPostgres(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Logf("pgbouncer output:\n%s\nlog (tail):\n%s", out.String(), tail(string(log), 3000))
		}
	})
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+pgbouncerPort, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("pgbouncer did not listen on %s: %v\n%s", pgbouncerPort, err, out.String())
		}
	}
	return "127.0.0.1:" + pgbouncerPort
}

// TestPgBouncer: examples/payments through PgBouncer in transaction
// pooling: three instances migrating one fresh schema at once, concurrent
// duplicates spread over them (one execution and one ledger row per key,
// identical replays, nothing stuck), and wait mode with LISTEN on a direct
// connection and, without one, polling that the log announces.
func TestPgBouncer(t *testing.T) {
	requireTopology(t, "test-pgbouncer")
	direct := pgstoretest.Pool(t)
	dcfg := direct.Config().ConnConfig
	bouncer := startPgBouncer(t, dcfg)
	schema := pgstoretest.Schema(t, direct)
	bin := buildPayments(t, t.TempDir())

	viaBouncer := (&url.URL{Scheme: "postgres", User: url.User(dcfg.User), Host: bouncer, Path: "/" + dcfg.Database,
		RawQuery: url.Values{"search_path": {schema}, "default_query_exec_mode": {"exec"}, "pool_max_conns": {"16"}}.Encode()}).String()
	directDSN := pgstoretest.DSN()

	// Three instances start at once: their migrations race through the pooler.
	argsOf := [][]string{
		{"-dsn", viaBouncer, "-tx-pooler", "-provider-latency", "150ms", "-lease", "5s"},
		{"-dsn", viaBouncer, "-tx-pooler", "-provider-latency", "150ms", "-lease", "5s", "-wait", "10s", "-listen-dsn", directDSN},
		{"-dsn", viaBouncer, "-tx-pooler", "-provider-latency", "150ms", "-lease", "5s", "-wait", "10s"},
	}
	servers := make([]*server, len(argsOf))
	var wg sync.WaitGroup
	for i, args := range argsOf {
		wg.Add(1)
		go func() {
			defer wg.Done()
			servers[i] = startPaymentsCtx(t, bin, 90*time.Second, args...)
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if s := servers[1].logs.String(); !strings.Contains(s, "listens on its own direct connection") {
		t.Errorf("the instance with -listen-dsn does not say it listens directly:\n%s", tail(s, 2000))
	}
	if s := servers[2].logs.String(); !strings.Contains(s, `"level":"WARN"`) || !strings.Contains(s, "poll") {
		t.Errorf("the instance without -listen-dsn does not warn that waiters poll:\n%s", tail(s, 2000))
	}
	var migrations int
	if err := direct.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, "idem_schema_migrations"}.Sanitize()).Scan(&migrations); err != nil || migrations == 0 {
		t.Fatalf("migrations recorded: %d, %v", migrations, err)
	}

	// Concurrent duplicates over the three instances.
	const keys, dups = 40, 6
	var conflicts, replays, fresh, unavailable atomic.Int64
	bodies := make([][][]byte, keys)
	deadline := time.Now().Add(60 * time.Second)
	for k := range keys {
		bodies[k] = make([][]byte, dups)
		for d := range dups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := servers[(k+d)%len(servers)]
				a := postUntilFinal(func() string { return s.base }, "u"+fmt.Sprint(k), "k-"+fmt.Sprint(k), 100+k, deadline, func(a answer) {
					switch {
					case a.status == 409:
						conflicts.Add(1)
					case a.status == 503 || a.err != nil:
						unavailable.Add(1)
					}
				})
				if a.status != 201 {
					t.Errorf("key %d: %d %s %v", k, a.status, a.body, a.err)
					return
				}
				if a.replayed {
					replays.Add(1)
				} else {
					fresh.Add(1)
				}
				bodies[k][d] = a.body
			}()
		}
	}
	wg.Wait()
	for k := range keys {
		for d := 1; d < dups; d++ {
			if bodies[k][d] != nil && !bytes.Equal(bodies[k][d], bodies[k][0]) {
				t.Errorf("key %d: bodies differ: %s vs %s", k, bodies[k][d], bodies[k][0])
			}
		}
	}
	if fresh.Load() != keys {
		t.Errorf("%d fresh 201s for %d keys: want exactly one execution per key", fresh.Load(), keys)
	}
	checkLedger(t, direct, schema, keys)
	t.Logf("PgBouncer (transaction pooling): %d keys x %d duplicates over 3 instances: %d fresh, %d replays, %d 409s retried, %d 503s/errors retried",
		keys, dups, fresh.Load(), replays.Load(), conflicts.Load(), unavailable.Load())

	// Wait mode: a burst on each waiting instance gets no 409 at all.
	for i, s := range servers[1:] {
		key := "wait-" + randomID()
		var wwg sync.WaitGroup
		var got409 atomic.Int64
		var created atomic.Int64
		for range 5 {
			wwg.Add(1)
			go func() {
				defer wwg.Done()
				a := post(s.base, "uw", key, 77)
				switch {
				case a.status == 201:
					created.Add(1)
				case a.status == 409:
					got409.Add(1)
				default:
					t.Errorf("wait mode (instance %d): %d %s %v", i+1, a.status, a.body, a.err)
				}
			}()
		}
		wwg.Wait()
		if got409.Load() != 0 || created.Load() != 5 {
			t.Errorf("wait mode (instance %d): %d 201s and %d 409s, want 5 and 0", i+1, created.Load(), got409.Load())
		}
	}
}

// checkLedger: one ledger row per key (users u0..u<keys-1>), and no record
// left processing.
func checkLedger(t *testing.T, pool *pgxpool.Pool, schema string, keys int) {
	t.Helper()
	ctx := context.Background()
	var rows, users, maxPerUser, processing int
	err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT user_id), coalesce(max(n), 0) FROM (SELECT user_id, count(*) OVER (PARTITION BY user_id) AS n FROM `+
		pgx.Identifier{schema, "payments"}.Sanitize()+` WHERE user_id ~ '^u[0-9]+$') r`).Scan(&rows, &users, &maxPerUser)
	if err != nil {
		t.Fatal(err)
	}
	if rows != keys || users != keys || maxPerUser != 1 {
		t.Errorf("ledger: %d rows for %d users (max %d per user), want %d, %d, 1", rows, users, maxPerUser, keys, keys)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "idem_records"}.Sanitize()+` WHERE status = 'processing'`).Scan(&processing); err != nil {
		t.Fatal(err)
	}
	if processing != 0 {
		t.Errorf("%d records left processing", processing)
	}
}
