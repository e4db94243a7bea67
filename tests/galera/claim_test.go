package galera

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/mysqlstore"
)

const route = "/v1/payments"

func engines(t *testing.T, stores [3]*mysqlstore.Store) [3]*core.Engine {
	t.Helper()
	var out [3]*core.Engine
	for i, s := range stores {
		e, err := core.New(s, core.WithLease(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		out[i] = e
	}
	return out
}

func request(scope, key, body string) core.Request {
	h := http.Header{}
	h.Set("Idempotency-Key", key)
	return core.Request{
		Method: http.MethodPost, Route: route, Target: route, Header: h,
		Body: strings.NewReader(body), Scope: scope,
	}
}

// TestClaimsAcrossNodes: 200 keys, each claimed at the same instant through
// three stores connected to the three nodes. Exactly one claim per key
// proceeds; every other one answers like a duplicate (409 in flight, or the
// winner's response replayed) and none fails: a certification conflict
// (1213) between nodes is normal operation, never a 503.
func TestClaimsAcrossNodes(t *testing.T) {
	const keys, parallelKeys = 200, 8
	c := newCluster(t)
	engs := engines(t, c.stores(t))
	cert0, bf0 := c.certStats(t)
	ctx := context.Background()

	var proceeds, conflicts, replays, failures atomic.Int64
	winners := make([]atomic.Int32, keys) // node+1 of the key's winner
	bodies := make([][]byte, keys)
	jobs := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range parallelKeys {
		wg.Go(func() {
			for k := range jobs {
				key := "race-" + strconv.Itoa(k)
				body := `{"amount":` + strconv.Itoa(k+1) + `}`
				var ready, claimed sync.WaitGroup
				gate := make(chan struct{})
				ready.Add(3)
				for node, eng := range engs {
					claimed.Go(func() {
						ready.Done()
						<-gate
						d, err := eng.Decide(ctx, request("tenant", key, body))
						if err != nil {
							failures.Add(1)
							t.Errorf("%s on node %d: Decide failed (a 503): %v", key, node+1, err)
							return
						}
						switch d.Outcome {
						case core.Proceed:
							proceeds.Add(1)
							if !winners[k].CompareAndSwap(0, int32(node+1)) {
								t.Errorf("%s: claimed on node %d and on node %d", key, winners[k].Load(), node+1)
							}
							resp := []byte(fmt.Sprintf(`{"key":%q,"node":%d}`, key, node+1))
							bodies[k] = resp
							if err := eng.Commit(ctx, d, adapterkit.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: resp}); err != nil {
								failures.Add(1)
								t.Errorf("%s on node %d: commit: %v", key, node+1, err)
							}
						case core.Replay:
							replays.Add(1)
						case core.Reject:
							if d.Response == nil || d.Response.Status != http.StatusConflict {
								failures.Add(1)
								t.Errorf("%s on node %d: rejected %+v, want 409 in flight", key, node+1, d.Response)
								return
							}
							conflicts.Add(1)
						default:
							failures.Add(1)
							t.Errorf("%s on node %d: outcome %v", key, node+1, d.Outcome)
						}
					})
				}
				ready.Wait()
				close(gate)
				claimed.Wait()
			}
		})
	}
	for k := range keys {
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	took := time.Since(start)

	// Every key has one winner, and every node replays the winner's response.
	for k := range keys {
		key := "race-" + strconv.Itoa(k)
		if winners[k].Load() == 0 {
			t.Errorf("%s: no claim proceeded", key)
			continue
		}
		for node, eng := range engs {
			d, err := eng.Decide(ctx, request("tenant", key, `{"amount":`+strconv.Itoa(k+1)+`}`))
			if err != nil || d.Outcome != core.Replay || d.Response == nil || !bytes.Equal(d.Response.Body, bodies[k]) {
				t.Errorf("%s: replay on node %d: %v %+v, want the winner's %s", key, node+1, err, d, bodies[k])
			}
		}
	}
	cert1, bf1 := c.certStats(t)
	t.Logf("%d keys x 3 nodes in %v: %d proceeded, %d 409 in flight, %d replays, %d failures; "+
		"cluster: %d certification failures, %d brute-force aborts during the run",
		keys, took.Round(time.Millisecond), proceeds.Load(), conflicts.Load(), replays.Load(), failures.Load(),
		cert1-cert0, bf1-bf0)
	if proceeds.Load() != keys {
		t.Errorf("%d claims proceeded for %d keys, want exactly one each", proceeds.Load(), keys)
	}
}

// TestCausalReplay: a response committed through one node is replayed by
// the next request on another node, never answered "in flight" (or run
// again) because that node had not applied the commit yet: mysqlstore reads
// causally on Galera (wsrep_sync_wait). The same sequence with causal reads
// off is the control: it shows the window the option closes (logged, not
// asserted: how often a node lags is up to the machine).
func TestCausalReplay(t *testing.T) {
	const keys = 150
	c := newCluster(t)
	if stale := replayAcrossNodes(t, engines(t, c.stores(t)), "causal", keys); stale != 0 {
		t.Errorf("with causal reads: %d of %d replays right after a commit on another node did not see it", stale, keys)
	}
	stale := replayAcrossNodes(t, engines(t, c.stores(t, mysqlstore.WithCausalReads(false))), "control", keys)
	t.Logf("control, causal reads off: %d of %d replays right after a commit on another node did not see it", stale, keys)
}

// replayAcrossNodes claims and commits keys through one node and replays
// each at once through the next; it returns how many replays did not see
// the commit.
func replayAcrossNodes(t *testing.T, engs [3]*core.Engine, prefix string, keys int) (stale int) {
	t.Helper()
	ctx := context.Background()
	for k := range keys {
		key := prefix + "-" + strconv.Itoa(k)
		body := `{"amount":` + strconv.Itoa(k+1) + `}`
		w, r := engs[k%3], engs[(k+1)%3] // write on one node, read on the next
		d, err := w.Decide(ctx, request("tenant", key, body))
		if err != nil || d.Outcome != core.Proceed {
			t.Fatalf("%s: first claim: %v %+v", key, err, d)
		}
		resp := []byte(`{"n":` + strconv.Itoa(k) + `}`)
		if err := w.Commit(ctx, d, adapterkit.Response{Status: http.StatusCreated, Body: resp}); err != nil {
			t.Fatalf("%s: commit: %v", key, err)
		}
		d2, err := r.Decide(ctx, request("tenant", key, body))
		if err != nil {
			t.Errorf("%s: replay on the next node: %v", key, err)
			continue
		}
		if d2.Outcome == core.Replay && d2.Response != nil && bytes.Equal(d2.Response.Body, resp) {
			continue
		}
		stale++
		if d2.Outcome == core.Proceed {
			_ = r.Abort(ctx, d2, nil)
		}
		if prefix == "causal" {
			var status int
			var b []byte
			if d2.Response != nil {
				status, b = d2.Response.Status, d2.Response.Body
			}
			t.Errorf("%s: right after the commit on node %d, node %d answered %v %d %s; want the replay",
				key, k%3+1, (k+1)%3+1, d2.Outcome, status, b)
		}
	}
	return stale
}
