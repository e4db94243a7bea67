package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestSweep: expired records go in bounded batches, oldest first; a record
// past retention but still held by a live lease, and a record expired less
// than the margin ago, stay.
func TestSweep(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			pool := pgstoretest.Pool(t)
			opts := append([]Option{WithRetentionMargin(30 * time.Minute)}, m.opts...)
			s := newStore(t, pool, opts...)
			schema := s.cfg.schema
			now := dbNow(t, pool)
			// Five completed records, created three hours ago with one
			// hour of retention: expired two hours ago.
			past := clockStore(t, pool, schema, now.Add(-3*time.Hour), opts...)
			for _, k := range []string{"a", "b", "c", "d", "e"} {
				r := claimReq(k, time.Minute)
				r.Retention = time.Hour
				completeKey(t, past, r, k)
			}
			// Past retention, but its owner is alive: lease runs for 4h.
			held := claimReq("held", 4*time.Hour)
			held.Retention = time.Hour
			if res, err := past.Claim(t.Context(), held); err != nil || !res.Claimed {
				t.Fatalf("claim held: %+v, %v", res, err)
			}
			// Expired 10 minutes ago: within the 30-minute margin.
			recent := clockStore(t, pool, schema, now.Add(-70*time.Minute), opts...)
			rr := claimReq("recent", time.Minute)
			rr.Retention = time.Hour
			completeKey(t, recent, rr, "recent")
			// Fresh.
			completeKey(t, s, claimReq("fresh", time.Minute), "fresh")

			if _, err := s.Sweep(t.Context(), 0); err == nil {
				t.Error("Sweep(0) succeeded")
			}
			if n, err := s.Sweep(t.Context(), 2); err != nil || n != 2 {
				t.Fatalf("Sweep(2) = %d, %v; want 2", n, err)
			}
			if n, err := s.Sweep(t.Context(), 100); err != nil || n != 3 {
				t.Fatalf("Sweep(100) = %d, %v; want 3", n, err)
			}
			if n, err := s.Sweep(t.Context(), 100); err != nil || n != 0 {
				t.Fatalf("Sweep again = %d, %v; want 0", n, err)
			}
			for _, k := range []string{"a", "e"} {
				if _, err := s.Get(t.Context(), "tenant", k); !errors.Is(err, storekit.ErrNotFound) {
					t.Errorf("Get(%s) after sweep: %v, want ErrNotFound", k, err)
				}
			}
			for _, k := range []string{"held", "recent", "fresh"} {
				if _, err := s.Get(t.Context(), "tenant", k); err != nil {
					t.Errorf("Get(%s) after sweep: %v, want the record kept", k, err)
				}
			}
			// Maintain sweeps too (plain mode: nothing else to do).
			if err := s.Maintain(t.Context()); err != nil {
				t.Fatalf("maintain: %v", err)
			}
		})
	}
}

func TestMaintainPlainSweepsEverything(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	s := newStore(t, pool, WithRetentionMargin(0))
	past := clockStore(t, pool, s.cfg.schema, dbNow(t, pool).Add(-2*time.Hour), WithRetentionMargin(0))
	const n = 2500 // more than one maintain batch
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+s.names.table+`
  (scope, key, method, route, fingerprint, status, token, locked_until, created_at, expires_at)
SELECT 'bulk', g::text, 'POST', '/r', 'f', 'failed', nextval('`+s.names.seq+`'), now() - interval '2 hours',
       now() - interval '2 hours', now() - interval '1 hour'
FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatal(err)
	}
	completeKey(t, past, claimReq("expired-too", time.Minute), "x")
	completeKey(t, s, claimReq("fresh", time.Minute), "x")
	if err := s.Maintain(t.Context()); err != nil {
		t.Fatalf("maintain: %v", err)
	}
	if got := countRows(t, pool, s.cfg.schema, s.cfg.table); got != 1 {
		t.Fatalf("%d rows left after Maintain, want 1 (fresh)", got)
	}
}
