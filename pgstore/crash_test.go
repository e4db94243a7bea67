package pgstore

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

const (
	crashChildEnv  = "PGSTORE_CRASH_CHILD_SCHEMA"
	crashLease     = time.Second
	crashKey       = `"crash-1"`
	crashKeyPlain  = "crash-1"
	crashClaimedOK = "CHILD CLAIMED"
)

func paymentRequest(key string) core.Request {
	return core.Request{
		Method: http.MethodPost, Route: "/v1/payments", Scope: "user-1",
		Header: http.Header{"Idempotency-Key": {key}},
		Body:   bytes.NewReader([]byte(`{"amount":1000,"currency":"JPY","to":"alice"}`)),
	}
}

// TestCrashChild is the child process of TestCrashedOwner; run directly it
// does nothing. It claims the key through an engine, writes its ledger row
// in the lease's transaction, says so on stdout, and hangs until killed.
func TestCrashChild(t *testing.T) {
	schema := os.Getenv(crashChildEnv)
	if schema == "" {
		return // not the child
	}
	pool := pgstoretest.Pool(t)
	s, err := New(pool, WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := core.New(s, core.WithLease(crashLease), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := eng.Decide(ctx, paymentRequest(crashKey))
	if err != nil || d.Outcome != core.Proceed {
		t.Fatalf("child decide: %+v, %v", d, err)
	}
	if err := handle(d.Context(ctx), pgTable(schema, "ledger"), crashKeyPlain); err != nil {
		t.Fatalf("child handler: %v", err)
	}
	os.Stdout.WriteString(crashClaimedOK + "\n")
	select {} // mid-handler, heartbeating, until SIGKILL
}

func pgTable(schema, table string) string {
	return `"` + schema + `"."` + table + `"`
}

// TestCrashedOwner: a child process claims a key and is killed with SIGKILL
// mid-handler (its ledger row written in its open transaction). A retry
// before the lease lapses gets 409; after, it takes over and the handler runs
// exactly once more; the dead owner never writes: its ledger row is absent
// and the stored response is the survivor's.
func TestCrashedOwner(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	s := newStore(t, pool)
	table := ledger(t, s)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+s.cfg.schema)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), crashClaimedOK) {
				claimed <- true
				break
			}
		}
		close(claimed)
		for sc.Scan() { // drain until the pipe closes
		}
	}()
	if ok := <-claimed; !ok {
		_ = cmd.Wait()
		t.Fatalf("child did not claim; stderr:\n%s", stderr.String())
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = cmd.Wait()
	rec, err := s.Get(t.Context(), "user-1", crashKeyPlain)
	if err != nil || rec.Status != storekit.StatusProcessing {
		t.Fatalf("record after the kill = %+v, %v; want processing", rec, err)
	}
	deadToken := rec.Token

	eng, err := core.New(s, core.WithLease(crashLease), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	// Before the lease lapses: 409, handler not run.
	d, err := eng.Decide(t.Context(), paymentRequest(crashKey))
	if err != nil || d.Outcome != core.Reject || d.Response.Status != http.StatusConflict {
		t.Fatalf("retry before lease expiry = %+v, %v; want 409", d, err)
	}
	// After: take over, run once.
	var runs int
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err = eng.Decide(t.Context(), paymentRequest(crashKey))
		if err != nil {
			t.Fatal(err)
		}
		if d.Outcome == core.Proceed {
			break
		}
		if d.Outcome != core.Reject || d.Response.Status != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("retry = %v %+v; want 409 until the lease lapses, then proceed", d.Outcome, d.Response)
		}
		time.Sleep(100 * time.Millisecond)
	}
	runs++
	hctx := d.Context(t.Context())
	if err := handle(hctx, table, crashKeyPlain); err != nil {
		_ = eng.Abort(t.Context(), d, err)
		t.Fatal(err)
	}
	if err := eng.Commit(t.Context(), d, adapterkit.Response{Status: 201, Body: []byte(`{"id":"survivor"}`)}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	rows := ledgerRows(t, s, table, crashKeyPlain)
	if len(rows) != 1 || rows[0] == deadToken {
		t.Fatalf("ledger rows %v (dead owner token %d); want exactly the survivor's", rows, deadToken)
	}
	d, err = eng.Decide(t.Context(), paymentRequest(crashKey))
	if err != nil || d.Outcome != core.Replay || string(d.Response.Body) != `{"id":"survivor"}` {
		t.Fatalf("final retry = %+v, %v; want replay of the survivor's response", d, err)
	}
	if runs != 1 {
		t.Fatalf("handler ran %d times after the crash", runs)
	}
}

// TestSlowOwnerKeepsLease: a handler that runs for several leases, kept
// alive by the engine's heartbeat, is never taken over by retries hammering
// it from another instance; they get 409 and then the replay.
func TestSlowOwnerKeepsLease(t *testing.T) {
	t.Parallel()
	a, b := twoStores(t)
	table := ledger(t, a)
	// Long enough for heartbeats (every lease/3, each bounded by lease/3)
	// to get through on a loaded machine with slow fsyncs: with 1s, a run
	// of three heartbeats over 333 ms each (two cores, -race, the chaos
	// test's two servers alongside) lost the lease about once in six runs.
	const lease = 2 * time.Second
	ea, err := core.New(a, core.WithLease(lease), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	eb, err := core.New(b, core.WithLease(lease), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	d, err := ea.Decide(t.Context(), paymentRequest(`"slow"`))
	if err != nil || d.Outcome != core.Proceed {
		t.Fatalf("decide: %+v, %v", d, err)
	}
	runs.Add(1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	stopRetries := sync.OnceFunc(func() { close(done); wg.Wait() })
	defer stopRetries()
	committed := false
	defer func() {
		if !committed { // the test stopped early: release the lease and its transaction
			_ = ea.Abort(context.Background(), d, errors.New("test stopped"))
		}
	}()
	wg.Add(1)
	go func() { // retries from the other instance
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(30 * time.Millisecond):
			}
			rd, err := eb.Decide(t.Context(), paymentRequest(`"slow"`))
			if err != nil {
				t.Errorf("retry: %v", err)
				return
			}
			switch rd.Outcome {
			case core.Proceed:
				runs.Add(1)
				t.Errorf("a retry took over a live, heartbeating owner")
				_ = eb.Abort(t.Context(), rd, nil)
				return
			case core.Reject:
				if rd.Response.Status != http.StatusConflict {
					t.Errorf("retry status %d, want 409", rd.Response.Status)
				}
			}
		}
	}()
	hctx := d.Context(t.Context())
	if err := handle(hctx, table, "slow"); err != nil {
		t.Fatal(err)
	}
	select { // three leases
	case <-time.After(3 * lease):
	case <-hctx.Done():
		t.Fatalf("handler context cancelled: %v", context.Cause(hctx))
	}
	committed = true
	if err := ea.Commit(t.Context(), d, adapterkit.Response{Status: 201, Body: []byte("slow ok")}); err != nil {
		t.Fatalf("commit after three leases: %v", err)
	}
	stopRetries()
	if runs.Load() != 1 || len(ledgerRows(t, a, table, "slow")) != 1 {
		t.Fatalf("runs=%d ledger=%v", runs.Load(), ledgerRows(t, a, table, "slow"))
	}
	rd, err := eb.Decide(t.Context(), paymentRequest(`"slow"`))
	if err != nil || rd.Outcome != core.Replay || string(rd.Response.Body) != "slow ok" {
		t.Fatalf("retry after commit = %+v, %v", rd, err)
	}
}
