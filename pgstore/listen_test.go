package pgstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

func TestListenOptions(t *testing.T) {
	pool := pgstoretest.Pool(t)
	if _, err := pgstore.New(pool, pgstore.WithListenConnString("")); err == nil {
		t.Error("an empty listen connection string was accepted")
	}
	if _, err := pgstore.New(pool, pgstore.WithListenConnString("postgres://u:secret@h:notaport/db")); err == nil ||
		strings.Contains(err.Error(), "secret") {
		t.Errorf("a bad listen connection string: %v (must fail without quoting it)", err)
	}
	schema := pgstoretest.Schema(t, pool)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool, pgstore.WithSchema(schema)); err != nil {
		t.Fatal(err)
	}
	inFlight := func(t *testing.T, st *pgstore.Store, key string) {
		t.Helper()
		if _, err := st.Claim(ctx, storekit.ClaimRequest{Scope: "s", Key: key, Method: "POST", Route: "/r", Fingerprint: "f",
			Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}

	// Behind a transaction pooler without a direct connection: a warning
	// at New, and Watch hands the engine no channel (it polls).
	var logs bytes.Buffer
	st, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithTransactionPooler(),
		pgstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "poll") {
		t.Errorf("no warning about polling: %q", logs.String())
	}
	inFlight(t, st, "k1")
	ch, release := st.Watch(ctx, "s", "k1")
	release()
	if ch != nil {
		t.Error("Watch behind a transaction pooler without a listen connection returned a channel")
	}

	// With a direct connection for LISTEN: woken as usual.
	st2, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithTransactionPooler(),
		pgstore.WithListenConnString(pgstoretest.DSN()))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	inFlight(t, st2, "k2")
	ch, release = st2.Watch(ctx, "s", "k2")
	defer release()
	if ch == nil {
		t.Fatal("Watch with a listen connection returned no channel")
	}
	r, err := st2.Get(ctx, "s", "k2")
	if err != nil {
		t.Fatal(err)
	}
	if err := st2.Fail(ctx, storekit.Fence{Scope: "s", Key: "k2", Token: r.Token}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Error("the waiter was not woken through the direct listen connection")
	}
}
