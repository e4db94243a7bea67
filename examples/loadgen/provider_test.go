package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

// TestProviderServer: the HTTP provider of -provider-http answers a charge
// with a charge id, over the pooled client every server uses, and refuses
// a charge without an Idempotency-Key.
func TestProviderServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- serveChild(ctx, "provider", "127.0.0.1:0", "", time.Millisecond, "", "none", pw) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("provider: %v", err)
		}
		_ = pw.Close()
	})
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addrc <- line.Addr
			}
		}
	}()
	var base string
	select {
	case a := <-addrc:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("provider did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("provider did not start within 30s")
	}
	c := newProviderClient()
	defer c.CloseIdleConnections()
	in := payIn{Amount: 1000, Currency: "JPY", To: "alice"}
	id, err := charge(ctx, c, base, "k1", in)
	if err != nil || !strings.HasPrefix(id, "ch_") {
		t.Fatalf("charge: %q, %v", id, err)
	}
	if _, err := charge(ctx, c, base, "", in); err == nil {
		t.Error("a charge without an Idempotency-Key was accepted")
	}
}

func TestParseFlagsProviderHTTP(t *testing.T) {
	cfg, err := parseFlags([]string{"-provider-http", "-targets", "idem,idem-nostep,article,baseline"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.providerHTTP || len(cfg.targets) != 4 || cfg.targets[1] != "idem-nostep" {
		t.Errorf("config: %+v", cfg)
	}
	if _, err := parseFlags([]string{"-serve", "provider"}, io.Discard); err != nil {
		t.Errorf("-serve provider: %v", err)
	}
}
