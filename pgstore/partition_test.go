package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// clockStore opens a store on schema whose database clock reads (roughly)
// at instead of now.
func clockStore(t *testing.T, pool *pgxpool.Pool, schema string, at time.Time, opts ...Option) *Store {
	t.Helper()
	offset := at.Sub(dbNow(t, pool))
	opts = append([]Option{WithSchema(schema), withClockOffset(offset)}, opts...)
	return openStore(t, pool, opts...)
}

func completeKey(t *testing.T, s *Store, req storekit.ClaimRequest, body string) storekit.Record {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil || !res.Claimed {
		t.Fatalf("claim %s: %+v, %v", req.Key, res, err)
	}
	f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	if err := s.Complete(t.Context(), f, storekit.StoredResponse{Status: 201, Body: []byte(body)}); err != nil {
		t.Fatalf("complete %s: %v", req.Key, err)
	}
	return res.Record
}

func countRows(t *testing.T, pool *pgxpool.Pool, schema, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{schema, table}.Sanitize()).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func requireReplay(t *testing.T, s *Store, req storekit.ClaimRequest, body string) {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatalf("retry claim %s: %v", req.Key, err)
	}
	if res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil ||
		string(res.Record.Response.Body) != body {
		t.Fatalf("retry claim %s = %+v; want the completed record replaying %q", req.Key, res, body)
	}
	rec, err := s.Get(t.Context(), req.Scope, req.Key)
	if err != nil || rec.Response == nil || string(rec.Response.Body) != body {
		t.Fatalf("get %s = %+v, %v", req.Key, rec, err)
	}
}

// TestPartitionDayBoundary: a record completed one second before a (UTC)
// midnight lands in that day's partition; a retry two seconds after midnight
// (its day has a partition of its own) still replays it. The boundary is 30
// days ahead, beyond the days Migrate creates, so both partitions are created
// explicitly for the two instants.
func TestPartitionDayBoundary(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	base := newStore(t, pool, WithPartitioning(1))
	schema := base.cfg.schema
	boundary := utcDay(dbNow(t, pool)).AddDate(0, 0, 31)
	before, after := boundary.Add(-time.Second), boundary.Add(2*time.Second)
	for _, at := range []time.Time{before, after} {
		if err := base.EnsurePartition(t.Context(), at); err != nil {
			t.Fatalf("EnsurePartition(%v): %v", at, err)
		}
	}
	lastDay := base.cfg.partitionName(before)

	early := clockStore(t, pool, schema, before, WithPartitioning(1))
	req := claimReq("midnight", time.Minute)
	req.Retention = 24 * time.Hour
	completeKey(t, early, req, "charged")
	if n := countRows(t, pool, schema, lastDay); n != 1 {
		t.Fatalf("partition %s holds %d payloads, want 1 (the record was completed before midnight)", lastDay, n)
	}

	late := clockStore(t, pool, schema, after, WithPartitioning(1))
	requireReplay(t, late, req, "charged")

	// A different request under the same key is still refused after
	// midnight: the claim table is not partitioned.
	other := req
	other.Fingerprint = "other"
	res, err := late.Claim(t.Context(), other)
	if err != nil || res.Claimed || res.Record.Fingerprint != req.Fingerprint {
		t.Fatalf("mismatched retry after midnight = %+v, %v", res, err)
	}
}

// TestMaintainDropsOnlyExpiredPartitions: Maintain creates the days ahead,
// drops past partitions whose payloads are all past retention + margin, and
// keeps a past partition still holding a long-retention payload.
func TestMaintainDropsOnlyExpiredPartitions(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	opts := []Option{WithPartitioning(3), WithRetentionMargin(time.Hour)}
	s := newStore(t, pool, opts...)
	schema := s.cfg.schema
	now := dbNow(t, pool)
	today := utcDay(now)
	tenDays, fiveDays, twoDays := today.AddDate(0, 0, -10), today.AddDate(0, 0, -5), today.AddDate(0, 0, -2)
	for _, d := range []time.Time{tenDays, fiveDays, twoDays} {
		if err := s.EnsurePartition(t.Context(), d.Add(12*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	// Short retention, completed ten days ago: long expired.
	old := clockStore(t, pool, schema, tenDays.Add(12*time.Hour), opts...)
	expiredReq := claimReq("expired", time.Minute)
	expiredReq.Retention = time.Hour
	completeKey(t, old, expiredReq, "old")
	// Thirty-day retention, completed five days ago: must survive.
	mid := clockStore(t, pool, schema, fiveDays.Add(12*time.Hour), opts...)
	liveReq := claimReq("live", time.Minute)
	liveReq.Retention = 30 * 24 * time.Hour
	completeKey(t, mid, liveReq, "kept")

	if err := s.Maintain(t.Context()); err != nil {
		t.Fatalf("maintain: %v", err)
	}
	days, err := s.Partitions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	have := map[time.Time]bool{}
	for _, d := range days {
		have[d] = true
	}
	if have[tenDays] || have[twoDays] {
		t.Errorf("partitions after Maintain = %v: the expired (%s) and empty (%s) past days should be gone",
			days, tenDays.Format(time.DateOnly), twoDays.Format(time.DateOnly))
	}
	if !have[fiveDays] {
		t.Errorf("partitions after Maintain = %v: %s holds a live payload and must stay", days, fiveDays.Format(time.DateOnly))
	}
	for d := 0; d <= 3; d++ {
		if day := today.AddDate(0, 0, d); !have[day] {
			t.Errorf("partitions after Maintain = %v: missing %s (days ahead)", days, day.Format(time.DateOnly))
		}
	}
	requireReplay(t, s, liveReq, "kept")
	// The expired record's claim row was swept with its payload.
	if _, err := s.Get(t.Context(), expiredReq.Scope, expiredReq.Key); !errors.Is(err, storekit.ErrNotFound) {
		t.Errorf("expired record after Maintain: %v, want ErrNotFound", err)
	}
	// Idempotent.
	if err := s.Maintain(t.Context()); err != nil {
		t.Fatalf("second maintain: %v", err)
	}
}

// TestPartitionDefaultCatchesMissingDay: with no partition for the day (far
// beyond the days ahead, as if maintenance had stopped), Complete still
// succeeds: the payload lands in the default partition. Maintain later
// moves it into the day's partition, and it keeps replaying throughout.
func TestPartitionDefaultCatchesMissingDay(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	s := newStore(t, pool, WithPartitioning(1))
	schema := s.cfg.schema
	future := utcDay(dbNow(t, pool)).AddDate(0, 0, 200).Add(6 * time.Hour)
	// New only: Migrate would create the partitions for the shifted clock.
	fs, err := New(pool, WithSchema(schema), WithPartitioning(1), withClockOffset(future.Sub(dbNow(t, pool))))
	if err != nil {
		t.Fatal(err)
	}
	req := claimReq("lonely", time.Minute)
	completeKey(t, fs, req, "caught")
	if n := countRows(t, pool, schema, s.cfg.table+"_payload_default"); n != 1 {
		t.Fatalf("default partition holds %d rows, want 1", n)
	}
	requireReplay(t, fs, req, "caught")
	if err := fs.Maintain(t.Context()); err != nil {
		t.Fatalf("maintain: %v", err)
	}
	if n := countRows(t, pool, schema, s.cfg.table+"_payload_default"); n != 0 {
		t.Fatalf("default partition holds %d rows after Maintain, want 0", n)
	}
	if n := countRows(t, pool, schema, s.cfg.partitionName(future)); n != 1 {
		t.Fatalf("partition %s holds %d rows, want the moved payload", s.cfg.partitionName(future), n)
	}
	requireReplay(t, fs, req, "caught")
}

func TestPartitionOnlyMethods(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	if err := s.EnsurePartition(t.Context(), time.Now()); err == nil {
		t.Error("EnsurePartition in plain mode succeeded")
	}
	if _, err := s.Partitions(t.Context()); err == nil {
		t.Error("Partitions in plain mode succeeded")
	}
}
