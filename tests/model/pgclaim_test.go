package model

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestPgstoreClaimOvertaken is the case the model found in
// TestPgstoreTransactional (testdata/pgstore-claim-overtaken-*.json): a
// claim draws its token, then waits for the record's row lock; meanwhile
// another request takes the record over under a larger token and fails.
// The waiting claim finds a failed record it may take over, but its token
// is older than the record's, so its statement leaves the record alone.
// Claim must then not answer "not claimed" with a record it could claim
// (the engine would answer 409 in-flight to a retry that should run): it
// claims it, or answers a record it cannot claim.
func TestPgstoreClaimOvertaken(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	app := "idem_model_" + hex.EncodeToString(b[:])
	cfg := pgstoretest.Config(t)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool := pgstoretest.NewPool(t, cfg)
	admin := pgstoretest.NewPool(t, pgstoretest.Config(t))
	schema := pgstoretest.Schema(t, admin)
	opts := []pgstore.Option{pgstore.WithSchema(schema)}
	if err := pgstore.Migrate(ctx, pool, opts...); err != nil {
		t.Fatalf("pgstore.Migrate: %v", err)
	}
	store, err := pgstore.New(pool, opts...)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	t.Cleanup(store.Close)
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	seq := pgx.Identifier{schema, "idem_records_token_seq"}.Sanitize()

	req := storekit.ClaimRequest{Scope: "s", Key: "k", Method: "POST", Route: "/model", Fingerprint: "A", Lease: Lease, Retention: Retention}
	first, err := store.Claim(ctx, req)
	if err != nil || !first.Claimed {
		t.Fatalf("first claim: %+v, %v", first, err)
	}
	if err := store.Fail(ctx, storekit.Fence{Scope: "s", Key: "k", Token: first.Record.Token}); err != nil {
		t.Fatalf("fail: %v", err)
	}

	// Another request's transaction holds the row.
	other, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(context.Background()) }()
	if _, err := other.Exec(ctx, "SELECT 1 FROM "+table+" WHERE scope = 's' AND key = 'k' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res storekit.ClaimResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := store.Claim(ctx, req)
		done <- answer{res, err}
	}()
	// The claim has drawn its token and waits for the row.
	for {
		var waiting int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", app).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case a := <-done:
			t.Fatalf("the claim did not wait for the row lock: %+v, %v", a.res, a.err)
		case <-ctx.Done():
			t.Fatal("the claim never waited for the row lock")
		case <-time.After(5 * time.Millisecond): // polling pg_stat_activity
		}
	}
	// The other request took the record over (a larger token) and failed.
	var overtaker int64
	if err := other.QueryRow(ctx, "UPDATE "+table+" SET token = nextval('"+seq+"'), status = 'failed' WHERE scope = 's' AND key = 'k' RETURNING token").Scan(&overtaker); err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil {
		t.Fatalf("claim: %v", a.err)
	}
	r := a.res.Record
	if !a.res.Claimed && r.Status == storekit.StatusFailed && r.Fingerprint == req.Fingerprint {
		t.Fatalf("claim answered not claimed with a failed record of the same request (token %d, overtaken by %d): a retry that should run gets 409", r.Token, overtaker)
	}
	if a.res.Claimed && r.Token <= overtaker {
		t.Fatalf("claimed under token %d, not larger than the record's %d", r.Token, overtaker)
	}
}
