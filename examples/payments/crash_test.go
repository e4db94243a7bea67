package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// countingProvider speaks the external provider protocol and counts every
// call per relayed Idempotency-Key. It deduplicates like a real provider
// (the same key gets the same charge), but the test counts calls, not
// charges: with the charge stored as a recovery point, a takeover must not
// call at all.
type countingProvider struct {
	mu    sync.Mutex
	calls map[string]int
	ids   map[string]string
	// answered receives the relayed key after each answer was written.
	answered chan string
}

func newCountingProvider() *countingProvider {
	return &countingProvider{calls: map[string]int{}, ids: map[string]string{}, answered: make(chan string, 16)}
}

func (p *countingProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
		http.NotFound(w, r)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.calls[key]++
	id, ok := p.ids[key]
	if !ok {
		id = "ch_count_" + randomID()
		p.ids[key] = id
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"id":%q}`, id)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	select {
	case p.answered <- key:
	default:
	}
}

func (p *countingProvider) snapshot() (map[string]int, map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	calls, ids := map[string]int{}, map[string]string{}
	for k, v := range p.calls {
		calls[k] = v
	}
	for k, v := range p.ids {
		ids[k] = v
	}
	return calls, ids
}

// TestCrashAfterChargeResumes is the recovery point through real processes,
// for every framework and both databases: two instances of the example on
// one schema (PostgreSQL) or database (MariaDB) with an external provider;
// the first is SIGKILLed after the provider answered and the charge was
// stored as a step, during the -book-latency before the ledger booking.
// After its lease, a retry through the second instance answers 201 with the
// same charge, the provider saw exactly one call for the relayed key, and
// the ledger has one row.
func TestCrashAfterChargeResumes(t *testing.T) {
	bin := buildBinary(t)
	for _, fw := range frameworkNames() {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			t.Run("postgres", func(t *testing.T) {
				t.Parallel()
				dsn := testDSN(t)
				checkCrashAfterCharge(t, bin, fw, dsn, pgStepStored(t, dsn))
			})
			t.Run("mysql", func(t *testing.T) {
				t.Parallel()
				cfg, dsn := testMySQL(t)
				checkCrashAfterCharge(t, bin, fw, dsn, mysqlStepStored(t, cfg))
			})
		})
	}
}

// checkCrashAfterCharge runs the crash on the database of dsn; stepStored
// reports whether the charge step is stored.
func checkCrashAfterCharge(t *testing.T, bin, fw, dsn string, stepStored func() bool) {
	const lease = 2 * time.Second
	prov := newCountingProvider()
	srv := httptest.NewServer(prov)
	t.Cleanup(srv.Close)
	// The completer is off: here the client's retry takes the key over
	// (completer_test.go has the completer do it).
	args := []string{"-framework", fw, "-dsn", dsn, "-provider-url", srv.URL,
		"-book-latency", "2s", "-lease", lease.String(), "-completer-interval", "0s"}
	owner := startProcess(t, bin, nil, args...)
	other := startProcess(t, bin, nil, args...)

	user, key := "u-"+randomID(), "k-"+randomID()
	body := paymentBody(4200)
	relayed := killAfterCharge(t, prov, owner, user, key, body, 1500*time.Millisecond, stepStored)

	// The dead owner's lease holds the key until it lapses; then the retry
	// takes over and resumes after the charge.
	deadline := time.Now().Add(lease + 2*requestTimeout)
	var got result
	for attempt := 0; ; attempt++ {
		got = mustDo(t, http.MethodPost, other.base+"/v1/payments", user, key, body)
		if got.status != http.StatusConflict {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still 409 after %d attempts: the dead owner's lease never lapsed", attempt+1)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got.status != http.StatusCreated || got.replayed {
		t.Fatalf("retry after the crash: %d replayed=%v %s, want a fresh 201", got.status, got.replayed, got.body)
	}
	var p Payment
	if err := json.Unmarshal(got.body, &p); err != nil {
		t.Fatalf("201 body %s: %v", got.body, err)
	}
	calls, ids := prov.snapshot()
	if calls[relayed] != 1 || len(calls) != 1 {
		t.Errorf("provider calls %v, want exactly one call, for relayed key %s", calls, relayed)
	}
	if p.ProviderChargeID != ids[relayed] {
		t.Errorf("the payment carries charge %q, the provider issued %q before the crash", p.ProviderChargeID, ids[relayed])
	}
	if ps := listPayments(t, other.base, user); len(ps) != 1 || ps[0].ID != p.ID || ps[0].ProviderChargeID != ids[relayed] {
		t.Errorf("ledger %+v, want exactly payment %s with charge %s", ps, p.ID, ids[relayed])
	}
	again := mustDo(t, http.MethodPost, other.base+"/v1/payments", user, key, body)
	if again.status != http.StatusCreated || !again.replayed || !bytes.Equal(again.body, got.body) {
		t.Errorf("replay: %d replayed=%v %s, want the 201 replayed", again.status, again.replayed, again.body)
	}
}

// killAfterCharge sends a payment to owner and SIGKILLs it once the
// provider answered and the charge step is stored (within stepWithin),
// during the -book-latency before the booking. It returns the relayed key
// the provider saw.
func killAfterCharge(t *testing.T, prov *countingProvider, owner process, user, key, body string, stepWithin time.Duration, stepStored func() bool) string {
	t.Helper()
	first := make(chan result, 1)
	go func() { first <- do(http.MethodPost, owner.base+"/v1/payments", user, key, body) }()
	var relayed string
	select {
	case relayed = <-prov.answered:
	case r := <-first:
		t.Fatalf("the owner answered %d %s (%v) before the provider was called", r.status, r.body, r.err)
	case <-time.After(requestTimeout):
		t.Fatal("the provider was not called")
	}
	waitFor(t, "the charge step stored", stepWithin, stepStored)
	owner.kill()
	if r := <-first; r.err == nil {
		t.Fatalf("the killed owner answered %d %s; the kill came too late (after the booking)", r.status, r.body)
	}
	return relayed
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %v", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pgStepStored reports whether the schema of dsn holds a stored step
// (pgstore's table idem_records_steps, migration 0005).
func pgStepStored(t *testing.T, dsn string) func() bool {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{u.Query().Get("search_path"), "idem_records_steps"}.Sanitize()
	pool := pgstoretest.Pool(t)
	return func() bool {
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatalf("read steps: %v", err)
		}
		return n > 0
	}
}

// mysqlStepStored reports whether the database of cfg holds a stored step
// (mysqlstore keeps them in the record's steps column, migration 0004).
func mysqlStepStored(t *testing.T, cfg *mysql.Config) func() bool {
	db := mysqlstoretest.Open(t, cfg)
	return func() bool {
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM idem_records WHERE steps IS NOT NULL AND JSON_LENGTH(steps) > 1").Scan(&n); err != nil {
			t.Fatalf("read steps: %v", err)
		}
		return n > 0
	}
}
