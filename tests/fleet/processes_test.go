package fleet

import (
	"bytes"
	"context"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestFleetProcesses: six examples/payments processes, one per
// -framework, on one -dsn (a fresh schema). A payment first made through
// each is replayed byte-identically by every other, and a duplicate sent
// through another framework while the first is still talking to the
// (slow) provider gets 409, never 422. Ports 15401-15406 (this test's own).
func TestFleetProcesses(t *testing.T) {
	bin := buildPayments(t)
	pool := pgstoretest.Pool(t)
	dsn := schemaDSN(t, pgstoretest.Schema(t, pool))
	frameworks := []string{"nethttp", "gin", "echo", "echov5", "fiber", "fiberv3"}
	bases := make([]string, len(frameworks))
	for i, fw := range frameworks {
		// The first instance's provider is slow, for the in-flight case.
		latency := "0s"
		if i == 0 {
			latency = "1500ms"
		}
		bases[i] = startPayments(t, bin, fw, fmt.Sprintf("127.0.0.1:%d", 15401+i), dsn, latency)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	const body = `{"amount":1000,"currency":"JPY","to":"alice"}`

	for i, fw := range frameworks {
		key := "proc-" + fw + "-" + fmt.Sprint(time.Now().UnixNano())
		first := post(t, c, bases[i], "/v1/payments", "u-"+fw, key, body)
		if first.status != http.StatusCreated {
			t.Fatalf("%s first: %d %s", fw, first.status, first.body)
		}
		for j, other := range frameworks {
			sameAnswer(t, fw+" -> "+other, first, post(t, c, bases[j], "/v1/payments", "u-"+fw, key, body))
		}
	}

	// In flight on nethttp (1.5s provider); duplicates through the others.
	key := "proc-inflight-" + fmt.Sprint(time.Now().UnixNano())
	var wg sync.WaitGroup
	var first result
	wg.Add(1)
	go func() { defer wg.Done(); first = post(t, c, bases[0], "/v1/payments", "u-inflight", key, body) }()
	time.Sleep(300 * time.Millisecond) // the claim is one statement; the provider call takes 1.5s
	for j := 1; j < len(frameworks); j++ {
		d := post(t, c, bases[j], "/v1/payments", "u-inflight", key, body)
		if d.status != http.StatusConflict || !bytes.Contains(d.body, []byte(problem.InFlight)) {
			t.Errorf("in flight on nethttp, duplicate via %s: %d %s, want 409 in-flight", frameworks[j], d.status, d.body)
		}
	}
	wg.Wait()
	if first.status != http.StatusCreated {
		t.Fatalf("in-flight first: %d %s", first.status, first.body)
	}
	for j, other := range frameworks {
		sameAnswer(t, "in-flight nethttp -> "+other, first, post(t, c, bases[j], "/v1/payments", "u-inflight", key, body))
	}
}

// buildPayments builds examples/payments once for the test.
func buildPayments(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "payments")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/idemkit/idem/examples/payments")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build examples/payments: %v\n%s", err, out)
	}
	return bin
}

// schemaDSN is the test DSN confined to schema.
func schemaDSN(t *testing.T, schema string) string {
	t.Helper()
	u, err := url.Parse(pgstoretest.DSN())
	if err != nil || u.Scheme == "" {
		t.Fatalf("the fleet test needs a URL-form %s (got %q): %v", pgstoretest.EnvDSN, pgstoretest.DSN(), err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("pool_max_conns", "4")
	u.RawQuery = q.Encode()
	return u.String()
}

// startPayments runs one instance until the test ends and waits for its
// /healthz.
func startPayments(t *testing.T, bin, framework, addr, dsn, providerLatency string) string {
	t.Helper()
	var logs idemtest.LogBuffer
	cmd := exec.Command(bin, "-addr", addr, "-framework", framework, "-dsn", dsn,
		"-provider-latency", providerLatency, "-lease", "10s", "-log", "json")
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", framework, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", framework, lastBytes(logs.String(), 4000))
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("%s exited before serving:\n%s", framework, logs.String())
		default:
		}
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy after 60s:\n%s", framework, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return strings.TrimSpace(s)
}
