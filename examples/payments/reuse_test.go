package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestReusedKeyAfterExpiry: once a key's record expired, the same key (and
// the same body) is a new payment: a new charge at the provider (a new relay
// key: the provider would otherwise answer with the old charge) and a new
// ledger row under a new payment id (the old id would collide with the old
// row). On memstore with a driven clock, and through PostgreSQL and MySQL
// and SQLite in transactional mode on their own clocks.
func TestReusedKeyAfterExpiry(t *testing.T) {
	t.Run("memstore", func(t *testing.T) {
		clock := &testClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
		log := slog.New(slog.DiscardHandler)
		ml := newMemLedger()
		cfg := defaultConfig(t)
		eng, err := core.New(ledgerStore{Store: memstore.New(memstore.WithClock(clock.Now)), ledger: ml, log: log}, engineOptions(cfg, log)...)
		if err != nil {
			t.Fatal(err)
		}
		prov := newSimProvider(0, log, 0)
		h := reuseHandler(t, &app{svc: &Service{ledger: ml, provider: prov, log: log}, eng: eng, log: log})
		checkReuse(t, h, prov, func(post func() (Payment, bool)) Payment {
			clock.Advance(cfg.retention + time.Second)
			p, replayed := post()
			if replayed {
				t.Fatal("replayed past retention")
			}
			return p
		})
	})
	for _, db := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(db, func(t *testing.T) {
			log := slog.New(slog.DiscardHandler)
			var (
				dsn    string
				store  core.Store
				ledger Ledger
			)
			switch db {
			case "postgres":
				dsn = testDSN(t)
			case "mysql":
				dsn = testMySQLDSN(t)
			default:
				dsn = testSQLiteDSN(t)
			}
			cfg := defaultConfig(t, "-dsn", dsn, "-lease", "200ms", "-retention", "1s")
			if db == "postgres" {
				pool, ps, pl, _, err := openPG(t.Context(), cfg, log)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				t.Cleanup(ps.Close)
				store, ledger = ps, pl
			} else if path, ok := sqlitePath(dsn); ok {
				sdb, ss, sl, err := openSQLite(t.Context(), path, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sdb.Close() })
				t.Cleanup(ss.Close)
				store, ledger = ss, sl
			} else {
				sdb, ms, ml, _, err := openMySQL(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sdb.Close() })
				store, ledger = ms, ml
			}
			eng, err := core.New(store, engineOptions(cfg, log)...)
			if err != nil {
				t.Fatal(err)
			}
			prov := newSimProvider(0, log, 0)
			h := reuseHandler(t, &app{svc: &Service{ledger: ledger, provider: prov, log: log}, eng: eng, log: log})
			checkReuse(t, h, prov, func(post func() (Payment, bool)) Payment {
				// The store's clock decides: retry until the key is new again.
				deadline := time.Now().Add(15 * time.Second)
				for {
					p, replayed := post()
					if !replayed {
						return p
					}
					if time.Now().After(deadline) {
						t.Fatal("the key was still replayed 15s past its 1s retention")
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
		})
	}
}

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func reuseHandler(t *testing.T, a *app) http.Handler {
	t.Helper()
	var err error
	if a.openapi, err = openAPIJSON(a.eng, false); err != nil {
		t.Fatal(err)
	}
	h, err := netHTTPHandler(a)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// checkReuse books a payment under one key, then calls expire (which posts
// the same request again until the key is new, and returns that payment)
// and checks the second payment is a payment of its own.
func checkReuse(t *testing.T, h http.Handler, prov *simProvider, expire func(post func() (Payment, bool)) Payment) {
	t.Helper()
	const user, key, body = "u1", "reused-key", `{"amount":1000,"currency":"JPY","to":"alice"}`
	post := func() (Payment, bool) {
		t.Helper()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
		req.Header.Set(userHeader, user)
		req.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(rec, req)
		b, _ := io.ReadAll(rec.Body)
		if rec.Code != http.StatusCreated {
			t.Fatalf("POST: %d %s", rec.Code, b)
		}
		var p Payment
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatalf("POST: %v: %s", err, b)
		}
		return p, rec.Header().Get(core.ReplayedHeader) == "true"
	}
	first, replayed := post()
	if replayed {
		t.Fatal("the first request was replayed")
	}
	if again, replayed := post(); !replayed || again != first {
		t.Fatalf("retry within retention: replayed %v, %+v, want %+v", replayed, again, first)
	}
	second := expire(post)
	if second.ID == first.ID {
		t.Errorf("the new payment reuses the old payment's id %s", first.ID)
	}
	if second.ProviderChargeID == first.ProviderChargeID {
		t.Errorf("the provider answered the new payment with the old charge %s", first.ProviderChargeID)
	}
	if n := prov.Charges(); n != 2 {
		t.Errorf("the provider charged %d times for two payments", n)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/v1/payments", nil)
	req.Header.Set(userHeader, user)
	h.ServeHTTP(rec, req)
	var rows []Payment
	if err := json.Unmarshal(rec.Body.Bytes(), &rows); err != nil {
		t.Fatalf("GET /v1/payments: %v: %s", err, rec.Body.Bytes())
	}
	if len(rows) != 2 || rows[0].ID != first.ID || rows[1].ID != second.ID {
		t.Errorf("ledger %+v, want the two payments %s then %s", rows, first.ID, second.ID)
	}
}
