package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

const (
	mpPathEnv = "SQLITESTORE_MP_PATH"
	mpKeys    = 50
	mpDups    = 3 // goroutines per key per process
)

// TestMultiProcess runs two processes (this test binary, re-executed) on
// one database file; each sends every key mpDups times concurrently.
// Exactly one execution per key must happen across both processes, and
// every key must end completed.
func TestMultiProcess(t *testing.T) {
	db, path := newDB(t)
	s := openStore(t, db)
	if _, err := db.Exec("CREATE TABLE executions (k TEXT NOT NULL, pid INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for range 2 {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMultiProcessChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), mpPathEnv+"="+path)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child %d: %v", i, err)
		}
	}
	rows, err := db.Query("SELECT k, COUNT(*), COUNT(DISTINCT pid) FROM executions GROUP BY k")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var k string
		var n, np int
		if err := rows.Scan(&k, &n, &np); err != nil {
			t.Fatal(err)
		}
		seen++
		if n != 1 {
			t.Errorf("key %s executed %d times", k, n)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != mpKeys {
		t.Errorf("%d keys executed, want %d", seen, mpKeys)
	}
	var procs int
	if err := db.QueryRow("SELECT COUNT(DISTINCT pid) FROM executions").Scan(&procs); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys executed once each, by %d processes", seen, procs)
	for i := range mpKeys {
		r, err := s.Get(t.Context(), "mp", "k"+strconv.Itoa(i))
		if err != nil || r.Status != storekit.StatusCompleted {
			t.Errorf("key k%d: %v %v, want completed", i, r.Status, err)
		}
	}
}

// TestMultiProcessChild is one process of TestMultiProcess.
func TestMultiProcessChild(t *testing.T) {
	path := os.Getenv(mpPathEnv)
	if path == "" {
		t.Skip("run by TestMultiProcess")
	}
	db, err := OpenDB(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pid := os.Getpid()
	var wg sync.WaitGroup
	for i := range mpKeys {
		for range mpDups {
			wg.Go(func() {
				if err := mpRequest(t.Context(), s, db, "k"+strconv.Itoa(i), pid); err != nil {
					t.Errorf("k%d: %v", i, err)
				}
			})
		}
	}
	wg.Wait()
}

// mpRequest claims key until it is completed, executing (one row in
// executions) and completing when it wins the claim. It watches the key
// before each claim: Watch reports changes made after its call only
// (storekit.Watcher), so a completion landing between a claim and a later
// Watch would never wake it, and the goroutine would wait forever.
func mpRequest(ctx context.Context, s *Store, db *sql.DB, key string, pid int) error {
	req := storekit.ClaimRequest{Scope: "mp", Key: key, Method: "POST", Route: "/r", Fingerprint: "f",
		Lease: time.Minute, Retention: time.Hour}
	for {
		done, err := func() (bool, error) {
			ch, release := s.Watch(ctx, "mp", key)
			defer release()
			res, err := s.Claim(ctx, req)
			if err != nil {
				return true, err
			}
			if res.Claimed {
				if _, err := db.ExecContext(ctx, "INSERT INTO executions (k, pid) VALUES (?, ?)", key, pid); err != nil {
					return true, fmt.Errorf("execute: %w", err)
				}
				return true, s.Complete(ctx, storekit.Fence{Scope: "mp", Key: key, Token: res.Record.Token}, storekit.StoredResponse{Status: 201})
			}
			if res.Record.Status == storekit.StatusCompleted {
				return true, nil
			}
			// In flight in this process or the other: wait for a change.
			select {
			case <-ch:
			case <-ctx.Done():
			}
			return false, nil
		}()
		if done {
			return err
		}
	}
}
