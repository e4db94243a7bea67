package mystores

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/nethttpidem"
)

// Handler behaviours of TxHandlerEnds, chosen per request by the
// X-Behaviour header.
const (
	plain         = "plain"           // writes in the lease transaction, leaves it to idem: 201
	deferRollback = "defer-rollback"  // the idiomatic `defer tx.Rollback()`: the writes roll back, then 201
	selfCommit    = "self-commit"     // commits the transaction itself, then 201
	commitThen500 = "commit-then-500" // commits itself, then answers 500 (retryable)
	// LedgerTableSQL creates TxHandlerEnds' ledger.
	LedgerTableSQL = "CREATE TABLE IF NOT EXISTS tx_ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARBINARY(255) NOT NULL, KEY (k)) ENGINE = InnoDB"
)

// TxHandlerEnds checks mysqlstore.Tx against handlers that end the lease
// transaction themselves (the *sql.Tx cannot refuse it): a response is
// never recorded unless the writes it describes committed with it, and a
// key whose writes did commit is never run again. Request i of a key goes
// through stores[i%len(stores)] (on Galera: one store per node, so every
// retry lands on another node). db creates (if missing) and reads the
// ledger table tx_ledger (causally on Galera).
func TxHandlerEnds(t *testing.T, db *sql.DB, stores []*mysqlstore.Store) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, LedgerTableSQL); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	prefix := ""
	var name, value string
	if err := db.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&name, &value); err == nil && value == "ON" {
		prefix = "SET STATEMENT wsrep_sync_wait = 1 FOR "
	}
	ledger := func(t *testing.T, key string) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, prefix+"SELECT COUNT(*) FROM tx_ledger WHERE k = ?", key).Scan(&n); err != nil {
			t.Fatalf("read ledger: %v", err)
		}
		return n
	}

	var runs counter
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		runs.add(key)
		tx, err := mysqlstore.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		behaviour := r.Header.Get("X-Behaviour")
		if behaviour == deferRollback {
			defer func() { _ = tx.Rollback() }()
		}
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO tx_ledger (k) VALUES (?)", key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if behaviour == selfCommit || behaviour == commitThen500 {
			if err := tx.Commit(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		if behaviour == commitThen500 {
			http.Error(w, "downstream failed after the commit", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"key":%q}`, key)
	})
	var servers []http.Handler
	for _, s := range stores {
		eng, err := core.New(s, core.WithLease(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		mw, err := nethttpidem.New(eng,
			nethttpidem.WithScope(func(*http.Request) (string, error) { return "tenant", nil }),
			nethttpidem.WithRoute(func(*http.Request) string { return "/v1/ledger" }))
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, mw(handler))
	}
	// do sends attempt i of key (through server i mod n).
	do := func(key, behaviour string, i int) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/ledger", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-Behaviour", behaviour)
		w := httptest.NewRecorder()
		servers[i%len(servers)].ServeHTTP(w, r)
		return w
	}
	run := func(name string, f func(t *testing.T, key string)) {
		t.Run(name, func(t *testing.T) { f(t, fmt.Sprintf("%s-%d", name, time.Now().UnixNano())) })
	}

	run("plain", func(t *testing.T, key string) {
		if w := do(key, plain, 0); w.Code != http.StatusCreated {
			t.Fatalf("first request: %d %s, want 201", w.Code, w.Body)
		}
		if w := do(key, plain, 1); w.Code != http.StatusCreated || runs.get(key) != 1 {
			t.Errorf("retry: %d, handler ran %d times; want the 201 replayed, one run", w.Code, runs.get(key))
		}
		if n := ledger(t, key); n != 1 {
			t.Errorf("%d ledger rows, want 1", n)
		}
	})

	run("defer-rollback", func(t *testing.T, key string) {
		w := do(key, deferRollback, 0)
		n := ledger(t, key)
		if w.Code != http.StatusInternalServerError || n != 0 {
			t.Errorf("handler that rolled its writes back: answered %d with %d ledger rows; want 500 and 0 (a 2xx would claim writes that never landed)", w.Code, n)
		}
		// The retry must run the handler again (nothing committed), not
		// replay a phantom 201.
		w = do(key, plain, 1)
		if w.Code != http.StatusCreated || runs.get(key) != 2 {
			t.Errorf("retry: answered %d after %d runs; want a fresh run (2) answering 201, not a replay of a response whose writes rolled back", w.Code, runs.get(key))
		}
		if n := ledger(t, key); n != 1 {
			t.Errorf("after the retry: %d ledger rows, want 1", n)
		}
		if w := do(key, plain, 2); w.Code != http.StatusCreated || runs.get(key) != 2 {
			t.Errorf("second retry: %d after %d runs, want the 201 replayed", w.Code, runs.get(key))
		}
	})

	run("self-commit", func(t *testing.T, key string) {
		if w := do(key, selfCommit, 0); w.Code != http.StatusCreated {
			t.Fatalf("handler that committed its own writes: answered %d %s, want its 201 (the writes landed)", w.Code, w.Body)
		}
		for i := 1; i <= 2; i++ {
			if w := do(key, selfCommit, i); w.Code != http.StatusCreated {
				t.Errorf("retry %d: answered %d, want the 201 replayed", i, w.Code)
			}
		}
		if n, r := ledger(t, key), runs.get(key); n != 1 || r != 1 {
			t.Errorf("%d ledger rows after %d runs, want 1 and 1: a retry ran committed writes again", n, r)
		}
	})

	run("commit-then-500", func(t *testing.T, key string) {
		if w := do(key, commitThen500, 0); w.Code != http.StatusInternalServerError {
			t.Errorf("first request: %d, want the handler's 500", w.Code)
		}
		w := do(key, commitThen500, 1)
		if n, r := ledger(t, key), runs.get(key); n != 1 || r != 1 {
			t.Errorf("retry answered %d; %d ledger rows after %d runs, want 1 and 1: the handler's writes had committed, running it again books twice", w.Code, n, r)
		}
		if w.Code != http.StatusConflict {
			t.Errorf("retry: %d, want 409 (completed, response not retained)", w.Code)
		}
	})
}

// counter counts handler runs per key.
type counter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counter) add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[key]++
}

func (c *counter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[key]
}
