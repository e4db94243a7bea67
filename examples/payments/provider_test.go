package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// TestHTTPProviderReusesConnections: concurrent charges reuse the client's
// keep-alive connections. On the default transport (2 idle connections per
// host) every round of 16 concurrent charges opened ~14 new connections.
func TestHTTPProviderReusesConnections(t *testing.T) {
	const clients, rounds = 16, 10
	var conns atomic.Int64
	var inFlight sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	p := newHTTPProvider(srv.URL, 10*time.Second)
	defer p.client.CloseIdleConnections()
	for range rounds {
		for range clients {
			inFlight.Add(1)
			go func() {
				defer inFlight.Done()
				if _, err := p.Charge(context.Background(), "k", Charge{Amount: 1, Currency: "JPY", To: "a"}); err != nil {
					t.Errorf("charge: %v", err)
				}
			}()
		}
		inFlight.Wait()
	}
	// A pooled client opens about one connection per concurrent charge; a
	// few more when the transport hands a connection back to its pool just
	// after the charge returned and the next round dials instead (17 of 16
	// in one make test run). The default transport opened ~130.
	if n, most := conns.Load(), int64(2*clients); n > most {
		t.Errorf("%d rounds of %d concurrent charges opened %d connections, want at most %d (keep-alive pool)", rounds, clients, n, most)
	}
}

// stepCounter counts the recovery points saved.
type stepCounter struct {
	ledgerStore
	saved atomic.Int64
}

func (s *stepCounter) SaveStep(ctx context.Context, f storekit.Fence, name string, result []byte) error {
	s.saved.Add(1)
	return s.ledgerStore.SaveStep(ctx, f, name, result)
}

// TestStepsFlag: -steps (default) keeps the charge as a recovery point;
// -steps=false books the same payment with the charge as a plain call.
func TestStepsFlag(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		steps int64
	}{{nil, 1}, {[]string{"-steps=false"}, 0}} {
		t.Run(strings.Join(append([]string{"args"}, tc.args...), " "), func(t *testing.T) {
			cfg := defaultConfig(t, tc.args...)
			log := slog.New(slog.DiscardHandler)
			ml := newMemLedger()
			store := &stepCounter{ledgerStore: ledgerStore{Store: memstore.New(), ledger: ml, log: log}}
			eng, err := core.New(store, engineOptions(cfg, log)...)
			if err != nil {
				t.Fatal(err)
			}
			prov := newSimProvider(0, log, 0)
			a := &app{svc: &Service{ledger: ml, provider: prov, noStep: !cfg.steps, log: log}, eng: eng, log: log}
			h, err := netHTTPHandler(a)
			if err != nil {
				t.Fatal(err)
			}
			var first []byte
			for i := range 2 {
				req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(paymentBody(1000)))
				req.Header.Set("X-User-ID", "u1")
				req.Header.Set("Idempotency-Key", "k1")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
				}
				if i == 0 {
					first = rec.Body.Bytes()
				} else if rec.Body.String() != string(first) {
					t.Errorf("replay %s, want %s", rec.Body, first)
				}
			}
			var p Payment
			if err := json.Unmarshal(first, &p); err != nil || p.ProviderChargeID == "" {
				t.Fatalf("payment %s: %v", first, err)
			}
			if got := prov.Charges(); got != 1 {
				t.Errorf("provider charged %d times, want 1", got)
			}
			if got := store.saved.Load(); got != tc.steps {
				t.Errorf("%d steps saved, want %d", got, tc.steps)
			}
		})
	}
}
