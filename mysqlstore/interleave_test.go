package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestTxInterleavings throws many concurrent executions in transactional
// mode, with short leases and random stalls, at a few keys; whatever the
// interleaving, every key ends completed with exactly one ledger row,
// written by the token that completed it.
func TestTxInterleavings(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	db.SetMaxOpenConns(16)
	s := openStore(t, db)
	if _, err := db.Exec("CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARBINARY(255) NOT NULL, owner BIGINT NOT NULL, KEY (k))"); err != nil {
		t.Fatal(err)
	}
	const (
		keys    = 6
		workers = 8
		lease   = 50 * time.Millisecond
	)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var (
		wg                       sync.WaitGroup
		commits, lost, conflicts atomic.Int64
		mu                       sync.Mutex
		completedBy              = map[string]int64{}
	)
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(k), uint64(w)))
				req := claimReq(key, lease)
				for ctx.Err() == nil {
					res, err := s.Claim(ctx, req)
					if err != nil {
						t.Errorf("claim %s: %v", key, err)
						return
					}
					if res.Record.Status == storekit.StatusCompleted {
						return
					}
					if !res.Claimed {
						conflicts.Add(1)
						time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
						continue
					}
					f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
					hctx := storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
					tx, err := Tx(hctx)
					if err == nil {
						_, err = tx.ExecContext(hctx, "INSERT INTO ledger (k, owner) VALUES (?, ?)", key, f.Token)
					}
					if err != nil {
						t.Errorf("handler %s: %v", key, err)
						return
					}
					// Stall: sometimes past the lease (a takeover may happen).
					time.Sleep(time.Duration(rng.IntN(int(2*lease/time.Millisecond))) * time.Millisecond)
					if rng.IntN(4) == 0 { // the handler failed: abort
						if err := s.Fail(hctx, f); err != nil && !errors.Is(err, core.ErrLeaseLost) {
							t.Errorf("fail %s: %v", key, err)
							return
						}
						continue
					}
					err = s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte(fmt.Sprint(f.Token))})
					switch {
					case err == nil:
						commits.Add(1)
						mu.Lock()
						if prev, ok := completedBy[key]; ok {
							t.Errorf("%s completed twice: tokens %d and %d", key, prev, f.Token)
						}
						completedBy[key] = f.Token
						mu.Unlock()
						return
					case errors.Is(err, core.ErrLeaseLost):
						lost.Add(1)
					default:
						t.Errorf("complete %s: %v", key, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("interleavings did not finish: %v", ctx.Err())
	}
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		rec, err := s.Get(t.Context(), "tenant", key)
		if err != nil || rec.Status != storekit.StatusCompleted {
			t.Errorf("%s: record %v, %v; want completed", key, rec.Status, err)
			continue
		}
		var owners []int64
		rows, err := db.Query("SELECT owner FROM ledger WHERE k = ?", key)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var o int64
			if err := rows.Scan(&o); err != nil {
				t.Fatal(err)
			}
			owners = append(owners, o)
		}
		_ = rows.Close()
		if len(owners) != 1 || owners[0] != rec.Token || completedBy[key] != rec.Token {
			t.Errorf("%s: ledger owners %v, record token %d, completed by %d; want exactly one row by the completing token",
				key, owners, rec.Token, completedBy[key])
		}
	}
	if st := db.Stats(); st.InUse != 0 {
		t.Errorf("%d connections still in use (a transaction never ended?)", st.InUse)
	}
	t.Logf("commits=%d lease-lost=%d in-flight-conflicts=%d", commits.Load(), lost.Load(), conflicts.Load())
}

// envChild makes the test binary a claiming child process (see
// TestProcessesOneWinner).
const envChild = "IDEM_MYSQLSTORE_CHILD_DSN"

// TestProcessesOneWinner: three OS processes (this test binary re-run) with
// 16 goroutines each claim the same 100 keys at once: exactly one claim per
// key across all processes.
func TestProcessesOneWinner(t *testing.T) {
	if dsn := os.Getenv(envChild); dsn != "" {
		childClaims(t, dsn)
		return
	}
	cfg := mysqlstoretest.Database(t, "")
	s := openStore(t, mysqlstoretest.Open(t, cfg)) // migrated once, before the children start
	const procs = 3
	outs := make([][]byte, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestProcessesOneWinner$", "-test.count=1")
			cmd.Env = append(os.Environ(), envChild+"="+cfg.FormatDSN())
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("child %d: %v\n%s", i, err, out)
			}
			outs[i] = out
		}()
	}
	wg.Wait()
	winners := map[string]int{}
	for _, out := range outs {
		for _, line := range strings.Split(string(out), "\n") {
			if key, ok := strings.CutPrefix(line, "CLAIMED "); ok {
				winners[key]++
			}
		}
	}
	for k := range 100 {
		key := "p-" + strconv.Itoa(k)
		if winners[key] != 1 {
			t.Errorf("%s: %d winners across processes, want 1", key, winners[key])
		}
		if r, err := s.Get(t.Context(), "tenant", key); err != nil || r.Status != storekit.StatusProcessing {
			t.Errorf("%s: %v %v", key, r.Status, err)
		}
	}
}

func childClaims(t *testing.T, dsn string) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(16)
	s, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 100 {
				key := "p-" + strconv.Itoa((k+g*7)%100)
				res, err := s.Claim(context.Background(), claimReq(key, time.Minute))
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if res.Claimed {
					mu.Lock()
					fmt.Println("CLAIMED " + key)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
}
