package pgstoretest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ClusterBinDir is where NewCluster finds initdb and pg_ctl unless
// IDEM_TEST_PG_BIN says otherwise.
const ClusterBinDir = "/usr/lib/postgresql/15/bin"

// EnvClusterBin names the environment variable overriding ClusterBinDir.
const EnvClusterBin = "IDEM_TEST_PG_BIN"

// Cluster is a throwaway PostgreSQL cluster of the test's own: its own data
// directory (a temporary directory), its own port on 127.0.0.1, fsync on.
// Tests that crash the database (Crash, then Start) use it, never the
// shared server. It is removed when the test ends.
type Cluster struct {
	// DSN connects to the cluster's postgres database as postgres.
	DSN string

	tb   testing.TB
	bin  string
	dir  string // owned by the postgres OS user
	data string
	port int
	run  []string // prefix running a command as the postgres OS user
}

// NewCluster creates a cluster with initdb and starts it on port (pick one
// unique to the test's owner: clusters of parallel test runs must not
// collide). settings are extra "name=value" server settings. The tests run
// as root on the development machines; PostgreSQL refuses to run as root,
// so the cluster's commands run as the postgres OS user (runuser). A
// missing PostgreSQL installation fails the test.
func NewCluster(tb testing.TB, port int, settings ...string) *Cluster {
	tb.Helper()
	bin := os.Getenv(EnvClusterBin)
	if bin == "" {
		bin = ClusterBinDir
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		tb.Fatalf("pgstoretest: a throwaway cluster needs PostgreSQL's initdb (%s=%q): %v", EnvClusterBin, bin, err)
	}
	dir, err := os.MkdirTemp("", "idem-pgcluster-")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{tb: tb, bin: bin, dir: dir, data: filepath.Join(dir, "data"), port: port}
	tb.Cleanup(func() {
		c.stop("immediate")
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("pgstoretest: remove cluster directory: %v", err)
		}
	})
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("pgstoretest: running as root, a cluster needs the postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatal(err)
		}
		c.run = []string{"runuser", "-u", "postgres", "--"}
	}
	c.cmd("initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions")
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(port),
		"unix_socket_directories = '" + dir + "'",
		"fsync = on",
		"synchronous_commit = on",
		"max_connections = 60",
		"shared_buffers = 32MB",
		"logging_collector = off",
	}
	for _, s := range settings {
		name, value, ok := strings.Cut(s, "=")
		if !ok {
			tb.Fatalf("pgstoretest: cluster setting %q: want name=value", s)
		}
		conf = append(conf, strings.TrimSpace(name)+" = "+strings.TrimSpace(value))
	}
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		tb.Fatal(err)
	}
	_, err = f.WriteString("\n# pgstoretest.NewCluster\n" + strings.Join(conf, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		tb.Fatal(err)
	}
	c.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	c.Start()
	return c
}

// cmd runs one of the cluster's programs as the postgres OS user and fails
// the test if it fails.
func (c *Cluster) cmd(prog string, args ...string) {
	c.tb.Helper()
	if out, err := c.exec(prog, args...); err != nil {
		c.tb.Fatalf("pgstoretest: %s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

func (c *Cluster) exec(prog string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := append(append(append([]string(nil), c.run...), filepath.Join(c.bin, prog)), args...)
	return exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
}

// Start starts the cluster (again) and waits until it accepts connections,
// crash recovery included.
func (c *Cluster) Start() {
	c.tb.Helper()
	if out, err := c.exec("pg_ctl", "-D", c.data, "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		c.tb.Fatalf("pgstoretest: start the cluster on port %d (in use by a leftover cluster?): %v\n%s\nserver log:\n%s", c.port, err, out, c.Log())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.DSN)
		if err == nil {
			_ = conn.Close(ctx)
			return
		}
		if ctx.Err() != nil {
			c.tb.Fatalf("pgstoretest: cluster on port %d not accepting connections: %v\n%s", c.port, err, c.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Crash stops the cluster the way a crash would: pg_ctl -m immediate (every
// server process exits at once, shared memory and its unwritten WAL are
// lost; recovery runs at the next Start).
func (c *Cluster) Crash() {
	c.tb.Helper()
	c.cmd("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop")
}

func (c *Cluster) stop(mode string) {
	if _, err := os.Stat(filepath.Join(c.data, "postmaster.pid")); err != nil {
		return
	}
	_, _ = c.exec("pg_ctl", "-D", c.data, "-m", mode, "-w", "stop")
}

// Log returns the server's log so far (for failure reports).
func (c *Cluster) Log() string {
	b, err := os.ReadFile(filepath.Join(c.dir, "server.log"))
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	return string(b)
}
