package topology

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var httpClient = &http.Client{Timeout: 20 * time.Second}

func randomID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// buildPayments builds examples/payments into dir.
func buildPayments(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "payments")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/idemkit/idem/examples/payments").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// logBuf collects a child's output.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var listeningRE = regexp.MustCompile(`"msg":"listening","addr":"([^"]+)"`)

type server struct {
	base string
	logs *logBuf
}

// startPayments starts the example and returns once it answers /healthz.
// It is stopped (SIGTERM) at cleanup.
func startPayments(t *testing.T, bin string, args ...string) *server {
	t.Helper()
	return startPaymentsCtx(t, bin, 60*time.Second, args...)
}

func startPaymentsCtx(t *testing.T, bin string, timeout time.Duration, args ...string) *server {
	t.Helper()
	args = append([]string{"-addr", "127.0.0.1:0", "-log", "json"}, args...)
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logs := &logBuf{}
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(logs, pw)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addrc <- m[1]:
				default:
				}
			}
		}
		// Keep reading whatever ends the scan (a line over the buffer): the
		// process's stderr writes into this pipe and cmd.Wait waits for
		// those writes, so a pipe nobody reads would hang the cleanup.
		_, _ = io.Copy(io.Discard, pr)
	}()
	// exited is closed when the process has exited (waitErr is then set):
	// a channel both the start-up wait and the cleanup can read, where a
	// value read by one would leave the other blocked (a process that
	// exited before listening hung the cleanup of a make test run).
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); _ = pw.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("payments %v logs (tail):\n%s", args, tail(logs.String(), 4000))
		}
	})
	select {
	case a := <-addrc:
		return &server{base: "http://" + a, logs: logs}
	case <-exited:
		t.Fatalf("payments %v exited: %v\n%s", args, waitErr, logs.String())
	case <-time.After(timeout):
		t.Fatalf("payments %v did not listen within %v\n%s", args, timeout, logs.String())
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

type answer struct {
	status   int
	body     []byte
	replayed bool
	err      error
}

func post(base, user, key string, amount int) answer {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments",
		strings.NewReader(fmt.Sprintf(`{"amount":%d,"currency":"JPY","to":"alice"}`, amount)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: b, replayed: resp.Header.Get("Idempotent-Replayed") == "true", err: err}
}

// postUntilFinal retries one payment as a client following the protocol
// would: the same key on 409, 503, 502 and connection errors, until a 201
// (or the deadline). It reports every answer's status.
func postUntilFinal(base func() string, user, key string, amount int, deadline time.Time, seen func(answer)) answer {
	backoff := 50 * time.Millisecond
	for {
		a := post(base(), user, key, amount)
		seen(a)
		if a.err == nil && a.status != http.StatusConflict && a.status < 500 {
			return a
		}
		if time.Now().After(deadline) {
			return a
		}
		time.Sleep(backoff)
		backoff = min(backoff*2, time.Second)
	}
}

// asPostgres runs name as the postgres OS user when the test runs as root
// (initdb, postgres and pgbouncer refuse root).
func asPostgres(name string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

// ownedDir makes a temp dir the postgres user can write.
func ownedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "idem-topology-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("the postgres OS user is needed: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func run(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	return string(out)
}

// pgBin finds a PostgreSQL server binary (initdb, pg_ctl, ...).
func pgBin(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) == 0 {
		t.Fatalf("%s not found (PostgreSQL server binaries are needed)", name)
	}
	return matches[len(matches)-1]
}

// requireTopology: these tests start their own servers and take tens of
// seconds; `make test` and their make targets run them (IDEM_TEST_TOPOLOGY=1).
func requireTopology(t *testing.T, target string) {
	if os.Getenv("IDEM_TEST_TOPOLOGY") == "" {
		t.Skipf("set IDEM_TEST_TOPOLOGY=1 (make %s) to run it", target)
	}
}
