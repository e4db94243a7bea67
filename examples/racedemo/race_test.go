package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestRaceDemo(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	rep, err := Run(ctx, Config{N: 20, Latency: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the demo took %v, want a few seconds", took)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results, want naive, idem and idem + wait", len(rep.Results))
	}
	naive, idem, wait := rep.Results[0], rep.Results[1], rep.Results[2]

	if naive.Charges <= 1 {
		t.Errorf("naive cache charged %d times, want more than 1 (the in-flight race)", naive.Charges)
	}
	if naive.MismatchStatus != http.StatusCreated || !strings.Contains(naive.MismatchBody, `"amount":1000`) {
		t.Errorf("naive mismatch: %d %s, want the first receipt replayed", naive.MismatchStatus, naive.MismatchBody)
	}

	if idem.Charges != 1 {
		t.Errorf("idem charged %d times, want 1", idem.Charges)
	}
	if idem.Statuses[http.StatusCreated] < 1 || idem.Statuses[http.StatusCreated]+idem.Statuses[http.StatusConflict] != 20 {
		t.Errorf("idem statuses %v, want one 201 and 409s (or replays)", idem.Statuses)
	}
	if idem.Statuses[http.StatusCreated]-idem.Replayed != 1 {
		t.Errorf("idem: %d fresh 201s, want exactly 1", idem.Statuses[http.StatusCreated]-idem.Replayed)
	}
	if idem.MismatchStatus != http.StatusUnprocessableEntity {
		t.Errorf("idem mismatch: %d %s, want 422", idem.MismatchStatus, idem.MismatchBody)
	}

	if wait.Charges != 1 || wait.Statuses[http.StatusCreated] != 20 || wait.Replayed != 19 {
		t.Errorf("idem + wait: %d charges, statuses %v, %d replayed; want 1, all 201, 19 replayed", wait.Charges, wait.Statuses, wait.Replayed)
	}
	if wait.MismatchStatus != http.StatusUnprocessableEntity {
		t.Errorf("idem + wait mismatch: %d, want 422", wait.MismatchStatus)
	}

	var out strings.Builder
	rep.Print(&out)
	for _, want := range []string{"naive cache", "idem", "payload-mismatch"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}

func TestRunRefusesTinyBurst(t *testing.T) {
	if _, err := Run(context.Background(), Config{N: 1, Latency: time.Millisecond}); err == nil {
		t.Error("N=1 accepted")
	}
}
