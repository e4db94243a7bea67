package fleet

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

// TestFleetCompressedBody: a body sent with Content-Encoding: gzip is
// fingerprinted as received by every adapter, so a key first served by any
// of them replays through every other (no 422), the handler running once,
// and the record is the same whichever adapter wrote it.
func TestFleetCompressedBody(t *testing.T) {
	store, _ := pgstores.Store(t)
	a := &app{entered: make(chan string, len(adapters)), release: make(chan struct{})}
	var servers []server
	for _, serve := range adapters {
		eng, err := core.New(store, core.WithLease(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, serve(t, eng, a))
	}
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(`{"amount":1000,"currency":"JPY"}`))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	body := gz.String()

	var fingerprint string
	for _, first := range servers {
		key := "fleet-gzip-" + first.name
		before := a.runs.Load()
		r := post(t, c, first.base, "/v1/payments", "carol", key, body, "Content-Encoding", "gzip")
		if r.status != http.StatusCreated || r.header.Get(core.ReplayedHeader) != "" {
			t.Fatalf("%s first: %d %s", first.name, r.status, r.body)
		}
		for _, other := range servers {
			sameAnswer(t, fmt.Sprintf("gzip %s -> %s", first.name, other.name), r,
				post(t, c, other.base, "/v1/payments", "carol", key, body, "Content-Encoding", "gzip"))
		}
		if ran := a.runs.Load() - before; ran != 1 {
			t.Errorf("gzip via %s: the handler ran %d times across the fleet, want 1", first.name, ran)
		}
		rec, err := store.Get(t.Context(), "carol", key)
		if err != nil {
			t.Fatal(err)
		}
		if fingerprint == "" {
			fingerprint = rec.Fingerprint
		} else if rec.Fingerprint != fingerprint {
			t.Errorf("gzip via %s: fingerprint %s, want %s as the others recorded", first.name, rec.Fingerprint, fingerprint)
		}
	}
}
