package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/pgstore/pgstoretest"
)

const (
	envWorker = "CONSUMER_TEST_WORKER_SCHEMA" // set in a worker process: its schema
	lease     = time.Second
	visible   = 3 * time.Second
)

// TestConsumerFaults: N payments, each published twice (so delivered at
// least twice), consumed by worker processes that SIGKILL themselves
// after the provider's charge and before the ledger commit on the first
// delivery of every third payment (and restarted). In the end the queue
// is empty, the ledger has one row per payment, and the provider charged
// each payment once: its relayed key was the same on every attempt.
func TestConsumerFaults(t *testing.T) {
	if schema := os.Getenv(envWorker); schema != "" {
		workerProcess(t, schema)
		return
	}
	const payments, procs = 12, 3
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pool := pgstoretest.Pool(t)
	schema := pgstoretest.Schema(t, pool)
	w, closeStore, err := setup(ctx, pool, schema, lease, visible, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	for i := range payments {
		m := Message{PaymentID: fmt.Sprintf("pay-%d", i), Account: "acct-1", Amount: int64(100 + i)}
		for range 2 {
			if err := w.Queue.Publish(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}

	exits := make(chan error, procs)
	startWorker := func() {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestConsumerFaults$", "-test.count=1", "-test.timeout=170s")
		cmd.Env = append(os.Environ(), envWorker+"="+schema)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { exits <- cmd.Wait() }()
	}
	for range procs {
		startWorker()
	}
	kills := 0
	for running := procs; running > 0; {
		err := <-exits
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL && ctx.Err() == nil {
			kills++
			startWorker() // a supervisor restarts a dead worker
			continue
		}
		if err != nil {
			t.Fatalf("worker: %v", err)
		}
		running-- // the queue is empty
	}

	var left, booked, distinct, charges, chargedPayments, attempts int
	q := w.Queue
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+q.table("queue")).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT payment_id) FROM "+q.table("ledger")).Scan(&booked, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT payment_id), coalesce(sum(attempts), 0) FROM "+q.table("provider_charges")).
		Scan(&charges, &chargedPayments, &attempts); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d payments, %d deliveries published, %d workers SIGKILLed mid-call, %d provider calls deduplicated to %d charges",
		payments, 2*payments, kills, attempts, charges)
	if left != 0 {
		t.Fatalf("%d messages left in the queue", left)
	}
	if booked != payments || distinct != payments {
		t.Fatalf("%d ledger rows for %d payments; want %d", booked, distinct, payments)
	}
	if charges != payments || chargedPayments != payments {
		t.Fatalf("%d provider charges for %d payments; want %d", charges, chargedPayments, payments)
	}
	if kills == 0 || attempts <= payments {
		t.Fatalf("%d kills, %d provider calls: the faults did not happen", kills, attempts)
	}
}

// workerProcess is one worker process of TestConsumerFaults.
func workerProcess(t *testing.T, schema string) {
	pool := pgstoretest.Pool(t)
	w, closeStore, err := setup(t.Context(), pool, schema, lease, visible, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	w.AfterCharge = func(d Delivery) {
		n, _ := strconv.Atoi(strings.TrimPrefix(d.Message.PaymentID, "pay-"))
		if d.Deliveries == 1 && n%3 == 0 {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL) // mid-call: charged, not booked
		}
	}
	if err := work(t.Context(), w, 2, true); err != nil {
		t.Fatal(err)
	}
}
