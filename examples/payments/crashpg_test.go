package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// crashPort is TestCrashPostgres's throwaway cluster (perf's range, 157xx).
const crashPort = 15702

// EnvCrashRounds sets TestCrashPostgres's number of rounds (make crash: more).
const envCrashRounds = "IDEM_CRASH_ROUNDS"

// TestCrashPostgres crashes PostgreSQL under the payments flow. On a
// throwaway cluster of its own (fsync on), the example runs in
// transactional mode (the ledger row and the stored response committed
// together, synchronously; claims synchronous too, since every execution
// relays a key) under concurrent load with duplicates; each round the
// cluster is stopped with pg_ctl -m immediate mid-load (every server
// process dies at once, unwritten WAL is lost) and restarted. Then every
// key is retried until it is answered, and the test checks:
//
//   - no key stuck: every key ends with a 201 (after its lease, at worst);
//   - right after each restart, before any request, every 201 answered
//     so far is in a completed record holding that body;
//   - every 201 ever sent for a key, before or after the crash, is
//     byte-identical to every other (replays included);
//   - at most one provider charge per key: the provider deduplicates on
//     the relayed Idempotency-Key, as a real one does (that is the
//     contract the handler relies on), and counts the distinct relay keys
//     it was sent for each payment (the charge's "to" names the test's
//     key); a handler run again after a crash between the charge and its
//     recovery point must send the same relay key, or money is charged
//     twice and booked once;
//   - one ledger row per key, and it is the one its 201 announced; every
//     201 has its ledger row, and every charge the provider made is booked
//     by exactly one row;
//   - no ledger row without its completed record (and no record left
//     processing).
func TestCrashPostgres(t *testing.T) {
	t.Parallel()
	rounds := 3
	if v := os.Getenv(envCrashRounds); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive integer", envCrashRounds, v)
		}
		rounds = n
	}
	cluster := pgstoretest.NewCluster(t, crashPort)
	bin := buildBinary(t)
	const lease = 2 * time.Second
	prov := newDedupProvider(t)
	t.Cleanup(prov.Close)
	base := startServer(t, bin, nil, "-dsn", cluster.DSN, "-provider-url", prov.URL, "-lease", lease.String())

	l := &crashLoad{base: base, answers: map[string][]result{}}
	for round := range rounds {
		l.round(t, cluster, round)
		if t.Failed() {
			break
		}
	}
	l.settle(t, 2*lease+10*time.Second)
	l.check(t, cluster.DSN, prov)
	calls, charges := prov.counts()
	t.Logf("%d rounds, %d keys, %d requests (%d during or right after a crash answered with an error), %d provider calls, %d charges",
		rounds, len(l.answers), l.requests, l.errors, calls, charges)
}

// dedupProvider is the payment provider as the example's contract has it:
// it deduplicates on the Idempotency-Key it is given (the same key returns
// the same charge and charges nothing more). It records, per payment (the
// charge's "to", which the test sets to the key), every relay key it was
// sent, and every charge it made.
type dedupProvider struct {
	*httptest.Server
	mu      sync.Mutex
	calls   int
	byRelay map[string]string          // relay key -> charge id
	relays  map[string]map[string]bool // "to" -> relay keys
	bad     []string                   // calls breaking the contract
}

func newDedupProvider(t *testing.T) *dedupProvider {
	p := &dedupProvider{byRelay: map[string]string{}, relays: map[string]map[string]bool{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c struct {
			To string `json:"to"`
		}
		err := json.NewDecoder(r.Body).Decode(&c)
		relay := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		defer p.mu.Unlock()
		p.calls++
		if err != nil || relay == "" || c.To == "" {
			p.bad = append(p.bad, fmt.Sprintf("relay key %q, to %q, body error %v", relay, c.To, err))
			http.Error(w, "bad charge", http.StatusBadRequest)
			return
		}
		id, ok := p.byRelay[relay]
		if !ok {
			id = fmt.Sprintf("ch_%d", len(p.byRelay)+1)
			p.byRelay[relay] = id
		}
		if p.relays[c.To] == nil {
			p.relays[c.To] = map[string]bool{}
		}
		p.relays[c.To][relay] = true
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":%q}`, id)
	}))
	return p
}

func (p *dedupProvider) counts() (calls, charges int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, len(p.byRelay)
}

// crashTo is the charge's recipient for a test key: the key itself, so
// the provider can tell which key a charge is for.
func crashTo(uk string) string { return strings.ReplaceAll(uk, " ", "_") }

type crashLoad struct {
	base string
	// pause holds the clients while the test inspects the database right
	// after a restart.
	pause sync.RWMutex

	mu       sync.Mutex
	answers  map[string][]result // "user key" -> every answer
	recent   []string            // keys to duplicate
	requests int
	errors   int
}

func splitUK(uk string) (user, key string) {
	for i := range len(uk) {
		if uk[i] == ' ' {
			return uk[:i], uk[i+1:]
		}
	}
	return "", uk
}

func (l *crashLoad) send(uk string) result {
	l.pause.RLock()
	defer l.pause.RUnlock()
	user, key := splitUK(uk)
	r := do(http.MethodPost, l.base+"/v1/payments", user, key,
		fmt.Sprintf(`{"amount":1000,"currency":"JPY","to":%q}`, crashTo(uk)))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests++
	if r.err != nil || (r.status != http.StatusCreated && r.status != http.StatusConflict) {
		l.errors++
	}
	if r.err == nil {
		l.answers[uk] = append(l.answers[uk], result{status: r.status, body: r.body, replayed: r.replayed})
	} else if _, ok := l.answers[uk]; !ok {
		l.answers[uk] = nil
	}
	return r
}

// round runs 8 clients, half their requests duplicates of recent keys,
// crashes the cluster after a second and restarts it, and keeps the load on
// for another second.
func (l *crashLoad) round(t *testing.T, c *pgstoretest.Cluster, round int) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(round), uint64(w)))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				var uk string
				l.mu.Lock()
				if len(l.recent) > 0 && rng.IntN(2) == 0 {
					uk = l.recent[rng.IntN(len(l.recent))]
				}
				l.mu.Unlock()
				if uk == "" {
					uk = fmt.Sprintf("u%d c%d-%d-%d", w%4, round, w, n)
					l.mu.Lock()
					l.recent = append(l.recent, uk)
					if len(l.recent) > 32 {
						l.recent = l.recent[1:]
					}
					l.mu.Unlock()
				}
				if r := l.send(uk); r.err != nil || r.status >= 500 {
					time.Sleep(20 * time.Millisecond) // the database is down
				}
			}
		}()
	}
	time.Sleep(time.Second)
	l.mu.Lock()
	before := l.requests
	l.mu.Unlock()
	c.Crash()
	// Wait for the requests in flight (they fail: the database is down),
	// and hold the clients until the check is done: every 201 answered
	// so far was committed before the crash, and no request reaches the
	// restarted database before the check.
	l.pause.Lock()
	c.Start()
	l.mu.Lock()
	sent := map[string][]byte{}
	for uk, rs := range l.answers {
		for _, r := range rs {
			if r.status == http.StatusCreated {
				sent[uk] = r.body
			}
		}
	}
	l.mu.Unlock()
	l.checkDurable(t, c.DSN, round, sent)
	l.pause.Unlock()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if before == 0 || l.requests == before {
		t.Errorf("round %d: %d requests before the crash, %d after: the crash did not happen under load", round, before, l.requests-before)
	}
}

// checkDurable checks, right after the restart and before any request,
// that every 201 answered so far (each was committed before the crash, or
// replayed from a committed record) is stored, byte for byte, in a
// completed record: what a client was told survives the crash (a
// completion lost in it would be re-run later, and with the charge kept as
// a recovery point the re-run would answer the same body: only the
// database can tell).
func (l *crashLoad) checkDurable(t *testing.T, dsn string, round int, sent map[string][]byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to the restarted cluster: %v", err)
	}
	defer conn.Close(ctx)
	lost := 0
	for uk, body := range sent {
		user, key := splitUK(uk)
		var (
			status string
			stored []byte
		)
		err := conn.QueryRow(ctx, `SELECT status, resp_body FROM idem_records WHERE scope = $1 AND key = $2`, user, key).Scan(&status, &stored)
		if err != nil || status != "completed" || !bytes.Equal(stored, body) {
			lost++
			if lost <= 5 {
				t.Errorf("round %d: key %q was answered 201 before the crash; after it the record is %q %s (%v)", round, uk, status, stored, err)
			}
		}
	}
	if lost > 0 {
		t.Errorf("round %d: %d of %d 201s answered before the crash are not durable", round, lost, len(sent))
	}
}

// settle retries every key until it is answered 201, within d in all.
func (l *crashLoad) settle(t *testing.T, d time.Duration) {
	deadline := time.Now().Add(d)
	l.mu.Lock()
	keys := make([]string, 0, len(l.answers))
	for uk := range l.answers {
		keys = append(keys, uk)
	}
	l.mu.Unlock()
	sort.Strings(keys)
	for _, uk := range keys {
		for {
			r := l.send(uk)
			if r.err == nil && r.status == http.StatusCreated {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("key stuck: %q still answered %d %s (%v) after %v", uk, r.status, r.body, r.err, d)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (l *crashLoad) check(t *testing.T, dsn string, prov *dedupProvider) {
	l.mu.Lock()
	defer l.mu.Unlock()
	prov.mu.Lock()
	defer prov.mu.Unlock()
	for _, b := range prov.bad {
		t.Errorf("provider called outside the contract: %s", b)
	}
	for uk := range l.answers {
		if n := len(prov.relays[crashTo(uk)]); n > 1 {
			t.Errorf("key %q: %d provider charges (distinct relay keys), want at most one", uk, n)
		}
	}
	for to := range prov.relays {
		if _, ok := l.answers[strings.ReplaceAll(to, "_", " ")]; !ok {
			t.Errorf("provider charged for %q, which no client sent", to)
		}
	}
	ids := map[string]string{}    // payment id -> key
	charge := map[string]string{} // payment id -> charge id in its 201
	for uk, rs := range l.answers {
		var first []byte
		for _, r := range rs {
			if r.status != http.StatusCreated {
				continue
			}
			if first == nil {
				first = r.body
				var p Payment
				if err := json.Unmarshal(r.body, &p); err != nil || p.ID == "" {
					t.Errorf("key %q: 201 body %s: %v", uk, r.body, err)
					continue
				}
				if other, dup := ids[p.ID]; dup {
					t.Errorf("payment %s answered for two keys, %q and %q", p.ID, other, uk)
				}
				ids[p.ID] = uk
				charge[p.ID] = p.ProviderChargeID
			} else if !bytes.Equal(r.body, first) {
				t.Errorf("key %q: a 201 (replayed=%v) %s differs from the first 201 %s", uk, r.replayed, r.body, first)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to the cluster: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id, provider_charge_id FROM payments`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ ID, Charge string }
	ledger, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	booked := map[string]int{} // charge id -> ledger rows
	for _, r := range ledger {
		booked[r.Charge]++
		if seen[r.ID] {
			t.Errorf("ledger row %s twice", r.ID)
		}
		seen[r.ID] = true
		if _, ok := ids[r.ID]; !ok {
			t.Errorf("ledger row %s matches no 201 any client got", r.ID)
		} else if charge[r.ID] != r.Charge {
			t.Errorf("ledger row %s books charge %s, its 201 announced %s", r.ID, r.Charge, charge[r.ID])
		}
	}
	for id, uk := range ids {
		if !seen[id] {
			t.Errorf("key %q was answered 201 with payment %s, which the ledger does not hold", uk, id)
		}
	}
	if len(ledger) != len(l.answers) {
		t.Errorf("%d ledger rows for %d keys", len(ledger), len(l.answers))
	}
	made := map[string]bool{}
	for relay, id := range prov.byRelay {
		made[id] = true
		if booked[id] != 1 {
			t.Errorf("provider charge %s (relay key %s…) is booked by %d ledger rows, want 1", id, relay[:min(len(relay), 12)], booked[id])
		}
	}
	for id := range booked {
		if !made[id] {
			t.Errorf("ledger books charge %s, which the provider never made", id)
		}
	}
	var orphans, processing int
	if err := conn.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM payments p WHERE NOT EXISTS (
     SELECT 1 FROM idem_records r
     WHERE r.status = 'completed' AND position(convert_to(p.id, 'UTF8') IN r.resp_body) > 0)),
  (SELECT count(*) FROM idem_records WHERE status <> 'completed')`).Scan(&orphans, &processing); err != nil {
		t.Fatal(err)
	}
	if orphans != 0 {
		t.Errorf("%d ledger rows without a completed record holding their 201", orphans)
	}
	if processing != 0 {
		t.Errorf("%d records not completed after every key was answered", processing)
	}
}
