package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// simProvider is the in-process payment provider of the embedded default.
// Like Stripe, it deduplicates on the Idempotency-Key it is given: the
// same key returns the same charge and charges nothing more. Like Stripe it
// forgets a key after a window (Stripe: 24 hours); main gives it idem's
// retention, within which a retry relays the same key. Forgetting keeps a
// long run's memory flat (make soak).
type simProvider struct {
	latency time.Duration
	log     *slog.Logger
	window  time.Duration

	mu      sync.Mutex
	byKey   map[string]string
	order   []keyAt // byKey's keys, oldest first
	charges int
}

type keyAt struct {
	key string
	at  time.Time
}

// newSimProvider returns a provider that remembers keys for window (0: a
// day).
func newSimProvider(latency time.Duration, log *slog.Logger, window time.Duration) *simProvider {
	if window <= 0 {
		window = 24 * time.Hour
	}
	return &simProvider{latency: latency, log: log, window: window, byKey: make(map[string]string)}
}

// Charge waits the simulated latency, then charges once per key.
func (p *simProvider) Charge(ctx context.Context, key string, c Charge) (string, error) {
	if p.latency > 0 {
		t := time.NewTimer(p.latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("provider: %w", context.Cause(ctx))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for len(p.order) > 0 && now.Sub(p.order[0].at) > p.window {
		delete(p.byKey, p.order[0].key)
		p.order[0] = keyAt{}
		p.order = p.order[1:]
	}
	if id, ok := p.byKey[key]; ok && key != "" {
		p.log.InfoContext(ctx, "provider: duplicate charge deduplicated", "charge", id, "relay_key", shortKey(key))
		return id, nil
	}
	id := "ch_" + randomHex(12)
	p.byKey[key] = id
	p.order = append(p.order, keyAt{key, now})
	p.charges++
	p.log.InfoContext(ctx, "provider: card charged", "charge", id, "amount", c.Amount, "currency", c.Currency,
		"to", c.To, "relay_key", shortKey(key), "charges_total", p.charges)
	return id, nil
}

// Charges returns how many charges were made.
func (p *simProvider) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges
}

// httpProvider is an external provider speaking the example's protocol:
// POST {url}/v1/charges with the relayed Idempotency-Key and
// {"amount","currency","to"}, answered 200 {"id":"ch_..."}. Any other
// status, a bad body or a network error is a failure.
//
// The client does not retry: a failure is reported to the payment's
// client as 502, whose own retry (same key, hence same relayed key) is the
// retry; the provider deduplicates it.
type httpProvider struct {
	url    string
	client *http.Client
}

// providerIdleConns is how many idle keep-alive connections the provider
// client keeps: as many as the charges this service may have in flight (a
// charge holds no database connection, so that is the number of concurrent
// payment requests, not the pool size). http.DefaultTransport keeps 2 per
// host: under 16 concurrent payments about one charge in four then opened a
// new TCP connection (issue 21). Copy this, not &http.Client{Timeout: …}.
const providerIdleConns = 128

func newHTTPProvider(url string, timeout time.Duration) *httpProvider {
	tr := http.DefaultTransport.(*http.Transport).Clone() // proxy, dialer, TLS and HTTP/2 defaults
	tr.MaxIdleConns = providerIdleConns
	tr.MaxIdleConnsPerHost = providerIdleConns
	tr.IdleConnTimeout = 90 * time.Second
	return &httpProvider{url: strings.TrimRight(url, "/"), client: &http.Client{Transport: tr, Timeout: timeout}}
}

func (p *httpProvider) Charge(ctx context.Context, key string, c Charge) (string, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("provider: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := p.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("provider: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("provider: read response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("provider: status %d", resp.StatusCode)
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return "", fmt.Errorf("provider: decode response: %w", err)
	}
	if out.ID == "" {
		return "", errors.New("provider: response without a charge id")
	}
	return out.ID, nil
}

// shortKey shows enough of a relayed key to correlate log lines.
func shortKey(k string) string {
	if len(k) > 13 {
		return k[:13] + "…"
	}
	return k
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
