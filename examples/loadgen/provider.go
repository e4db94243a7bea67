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
	"net"
	"net/http"
	"time"
)

// The HTTP provider (-provider-http): one process on 127.0.0.1 that every
// server calls over HTTP, as examples/payments calls its -provider-url. It
// speaks the example's protocol (POST /v1/charges, Idempotency-Key,
// {"amount","currency","to"} -> 200 {"id":"ch_..."}), waits
// -provider-latency, and does not deduplicate: it is a load fixture, and
// keeping no state keeps its cost the same for every server.

// providerIdleConns is the idle keep-alive connections a server's provider
// client keeps: at least the concurrent charges (16 clients here), so that
// no charge opens a new TCP connection (http.DefaultTransport keeps 2).
const providerIdleConns = 128

// newProviderClient is the pooled client every loadgen server uses, the same
// shape as examples/payments' provider client.
func newProviderClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = providerIdleConns
	tr.MaxIdleConnsPerHost = providerIdleConns
	tr.IdleConnTimeout = 90 * time.Second
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// charge calls the provider at base with key; it returns the charge id.
func charge(ctx context.Context, c *http.Client, base, key string, in payIn) (string, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("provider: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("provider: %w", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("provider: read: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("provider: status %d", res.StatusCode)
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.ID == "" {
		return "", errors.New("provider: no charge id in the answer")
	}
	return out.ID, nil
}

// serveProvider is the child mode -serve provider.
func serveProvider(ctx context.Context, addr string, latency time.Duration, logOut io.Writer) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", func(w http.ResponseWriter, r *http.Request) {
		var in payIn
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in); err != nil || r.Header.Get("Idempotency-Key") == "" {
			http.Error(w, `{"status":400}`, http.StatusBadRequest)
			return
		}
		if latency > 0 {
			t := time.NewTimer(latency)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		var b [12]byte
		_, _ = rand.Read(b[:])
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_` + hex.EncodeToString(b[:]) + `"}`))
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	slog.New(slog.NewJSONHandler(logOut, nil)).Info("listening", "addr", ln.Addr().String(), "server", "provider")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
