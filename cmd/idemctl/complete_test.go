package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/completer"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/nethttpidem"
)

// service is a payments endpoint on eng: the charge is a step; die, when
// set, kills the process after it.
func service(t *testing.T, eng *core.Engine, charges, booked *atomic.Int32, die func()) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /pay", func(w http.ResponseWriter, r *http.Request) {
		if _, err := core.Step(r.Context(), "charge", func(context.Context) ([]byte, error) {
			charges.Add(1)
			return []byte("ch_1"), nil
		}); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if die != nil {
			die()
			http.Error(w, "dead", http.StatusInternalServerError)
			return
		}
		booked.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"charge":"ch_1"}`))
	})
	mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		return r.Header.Get("X-User-ID"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(mux)
	if _, err := completer.New(eng, completer.HTTP(http.MethodPost, "/pay", h, "X-User-ID")); err != nil {
		t.Fatal(err) // registered: its requests are kept
	}
	return h
}

func TestCompleteFinishesThroughTheService(t *testing.T) { backends(t, testComplete) }

func testComplete(t *testing.T, c ctl, st core.Store) {
	const lease = 100 * time.Millisecond
	key := "k-" + sentinel
	var charges, booked atomic.Int32
	send := func(h http.Handler) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-User-ID", "u1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	d := storetest.NewDying(st)
	deadEng, err := core.New(d, core.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	if w := send(service(t, deadEng, &charges, &booked, d.Kill)); w.Code < 500 {
		t.Fatalf("the dying owner answered %d", w.Code)
	}
	var rec recordJSON
	c.json(&rec, "inspect", "-scope", "u1", "--", key)
	if len(rec.Steps) != 1 || rec.Steps[0].Name != "charge" || !rec.Steps[0].KeptRequest || rec.Steps[0].ResultBytes != len("ch_1") {
		t.Errorf("inspect shows steps %+v, want charge (4 bytes) with the kept request", rec.Steps)
	}
	// The service's own lease is the default: a short one could lapse
	// under a loaded host while it finishes the record.
	eng, err := core.New(st)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(service(t, eng, &charges, &booked, nil))
	t.Cleanup(srv.Close)

	deadline := time.Now().Add(10 * time.Second)
	for {
		r := c.run("complete", "-url", srv.URL)
		if r.code != exitOK {
			t.Fatalf("complete: exit %d: %s", r.code, r.stderr)
		}
		if r.stdout == "finished 1, failed 0, too old 0\n" {
			break
		}
		if r.stdout != "finished 0, failed 0, too old 0\n" || time.Now().After(deadline) {
			t.Fatalf("complete: %q", r.stdout)
		}
		time.Sleep(20 * time.Millisecond) // polls until the dead owner's lease lapsed
	}
	if charges.Load() != 1 || booked.Load() != 1 {
		t.Errorf("charges %d, bookings %d: want one of each", charges.Load(), booked.Load())
	}
	w := send(srv.Config.Handler)
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("the client's retry: %d replayed=%q, want the 201 replayed", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if r := c.run("complete", "-url", srv.URL); r.stdout != "finished 0, failed 0, too old 0\n" {
		t.Errorf("a second pass: %q, want nothing left", r.stdout)
	}
	if r := c.run("complete", "-url", "ftp://x"); r.code != exitUsage {
		t.Errorf("a bad -url: exit %d, want %d", r.code, exitUsage)
	}
}
