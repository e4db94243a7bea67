package mysqlstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestClockIsUTC: whatever the session's time zone, the store's instants
// are UTC from the server's clock (UTC_TIMESTAMP(6)), not local wall time
// read as UTC (which would be 9 hours off here).
func TestClockIsUTC(t *testing.T) {
	cfg := mysqlstoretest.Database(t, "")
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+09:00'"
	db := mysqlstoretest.Open(t, cfg)
	s := openStore(t, db)
	var tz string
	if err := db.QueryRow("SELECT @@session.time_zone").Scan(&tz); err != nil || tz != "+09:00" {
		t.Fatalf("session time zone %q (%v): the DSN parameter did not apply", tz, err)
	}
	now, err := s.now(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(now); d > 5*time.Second || d < -5*time.Second {
		t.Errorf("database clock %v is %v from this machine's: not UTC?", now, d)
	}
	res, err := s.Claim(t.Context(), claimReq("k", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if d := res.Record.LockedUntil.Sub(now); d < 59*time.Second || d > 65*time.Second {
		t.Errorf("LockedUntil %v is %v after the clock, want ~1m", res.Record.LockedUntil, d)
	}
}

// TestClockOffsetSweep: a store whose clock runs 2h ahead (tests only)
// sweeps what a normal store wrote with 1h retention.
func TestClockOffsetSweep(t *testing.T) {
	db := mysqlstoretest.NewDB(t, "")
	s := openStore(t, db)
	ahead := openStore(t, db, withClockOffset(2*time.Hour), WithRetentionMargin(time.Minute))
	if _, err := s.Claim(t.Context(), claimReq("k", time.Minute)); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(t.Context(), 10); err != nil || n != 0 {
		t.Fatalf("sweep now: %d %v, want 0", n, err)
	}
	if n, err := ahead.Sweep(t.Context(), 10); err != nil || n != 1 {
		t.Fatalf("sweep 2h ahead: %d %v, want 1", n, err)
	}
}
