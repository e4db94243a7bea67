package pgstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

func requirePrefixed(t *testing.T, err error, op string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", op)
	}
	if !strings.HasPrefix(err.Error(), "pgstore: "+op) {
		t.Fatalf("%s: error %q lacks context", op, err)
	}
}

// TestPoolExhausted: every connection is taken; the store's calls return an
// error wrapping the context's deadline instead of hanging or panicking.
func TestPoolExhausted(t *testing.T) {
	t.Parallel()
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 1
	pool := pgstoretest.NewPool(t, cfg)
	s := newStore(t, pool)
	res, err := s.Claim(t.Context(), claimReq("k", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	f := storekit.Fence{Scope: "tenant", Key: "k", Token: res.Record.Token}
	conn, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	calls := map[string]func(ctx context.Context) error{
		"claim":     func(ctx context.Context) error { _, err := s.Claim(ctx, claimReq("other", time.Minute)); return err },
		"heartbeat": func(ctx context.Context) error { return s.Heartbeat(ctx, f, time.Minute) },
		"complete":  func(ctx context.Context) error { return s.Complete(ctx, f, storekit.StoredResponse{Status: 200}) },
		"fail":      func(ctx context.Context) error { return s.Fail(ctx, f) },
		"get":       func(ctx context.Context) error { _, err := s.Get(ctx, "tenant", "k"); return err },
		"sweep":     func(ctx context.Context) error { _, err := s.Sweep(ctx, 10); return err },
	}
	for op, call := range calls {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		err := call(ctx)
		cancel()
		requirePrefixed(t, err, op)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v does not wrap context.DeadlineExceeded", op, err)
		}
	}
	// Transactional mode: the transaction takes its connection at its
	// first statement (Tx itself sends nothing).
	hctx := storetest.ContextWithLease(t.Context(), storetest.NewLease(s, f))
	ctx, cancel := context.WithTimeout(hctx, 50*time.Millisecond)
	defer cancel()
	tx, err := Tx(ctx)
	if err != nil {
		t.Fatalf("Tx: %v", err)
	}
	_, err = tx.Exec(ctx, "SELECT 1")
	requirePrefixed(t, err, "tx: acquire connection")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("first statement on a full pool: %v does not wrap context.DeadlineExceeded", err)
	}
}

// TestClosedPool: a closed pool is an error, not a panic.
func TestClosedPool(t *testing.T) {
	t.Parallel()
	admin := pgstoretest.Pool(t)
	schema := newStore(t, admin).cfg.schema
	pool := pgstoretest.Pool(t)
	s, err := New(pool, WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	_, err = s.Claim(t.Context(), claimReq("k", time.Minute))
	requirePrefixed(t, err, "claim")
	_, err = s.Get(t.Context(), "tenant", "k")
	requirePrefixed(t, err, "get")
}

// TestConnectionKilled: the server terminates the store's connection
// between calls (fail-over, restart, idle kill). The next call fails with a
// wrapped error or succeeds on a fresh connection; then the store recovers.
func TestConnectionKilled(t *testing.T) {
	t.Parallel()
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 1
	pool := pgstoretest.NewPool(t, cfg)
	admin := pgstoretest.Pool(t)
	s := newStore(t, pool)
	var pid uint32
	if err := pool.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(t.Context(), "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	_, err := s.Claim(t.Context(), claimReq("k", time.Minute))
	if err != nil {
		requirePrefixed(t, err, "claim")
		t.Logf("claim on a killed connection: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = s.Claim(t.Context(), claimReq("k2", time.Minute))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store did not recover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSerializationFailure: with a pool whose sessions default to
// SERIALIZABLE (a setting some deployments use), concurrent claims of one
// key can fail with SQLSTATE 40001. The failure is returned wrapped, with
// the SQLSTATE reachable through errors.As, and exactly one claim wins.
func TestSerializationFailure(t *testing.T) {
	t.Parallel()
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 8
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool := pgstoretest.NewPool(t, cfg)
	s := newStore(t, pool)
	warmPool(t, pool, 8)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		claimed  int
		failures int
		start    = make(chan struct{})
	)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := s.Claim(t.Context(), claimReq("hot", time.Minute))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				var pgErr *pgconn.PgError
				if !strings.HasPrefix(err.Error(), "pgstore: claim: ") || !errors.As(err, &pgErr) || pgErr.Code != "40001" {
					t.Errorf("claim error %v: want a wrapped 40001", err)
				}
				failures++
				return
			}
			if res.Claimed {
				claimed++
			}
		}()
	}
	close(start)
	wg.Wait()
	if claimed != 1 {
		t.Errorf("%d claims won, want 1", claimed)
	}
	t.Logf("serialization failures: %d of 32", failures)
}

// TestTxIdleTimeout: WithTxIdleTimeout sets the server-side backstop on the
// transactions Tx begins, in the same round trip as BEGIN.
func TestTxIdleTimeout(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	s := newStore(t, pool, WithTxIdleTimeout(1500*time.Millisecond))
	ctx, _ := mustClaim(t, s, claimReq("k", time.Minute))
	tx, err := Tx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var v string
	if err := tx.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != "1500ms" {
		t.Errorf("idle_in_transaction_session_timeout = %q, want 1500ms", v)
	}
	l, _ := storekit.LeaseFromContext(ctx)
	if err := s.Fail(ctx, l.Fence()); err != nil {
		t.Fatal(err)
	}
}

// warmPool opens n connections so that concurrent calls start together.
func warmPool(t *testing.T, pool interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := pool.Exec(t.Context(), "SELECT pg_sleep(0.05)"); err != nil {
				t.Errorf("warm pool: %v", err)
			}
		}()
	}
	wg.Wait()
}

// TestNotMigrated: a store on a schema that Migrate never ran on answers
// with an error that says what to do, wrapped with the operation.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	schema := pgstoretest.Schema(t, pool) // exists, but holds no idem objects
	s, err := New(pool, WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(t.Context(), claimReq("k", time.Minute))
	requirePrefixed(t, err, "claim")
	if err == nil || !strings.Contains(err.Error(), "run pgstore.Migrate") {
		t.Fatalf("claim on an unmigrated schema: %v", err)
	}
	_, err = s.Get(t.Context(), "tenant", "k")
	if err == nil || !strings.Contains(err.Error(), "run pgstore.Migrate") {
		t.Fatalf("get on an unmigrated schema: %v", err)
	}
}

// TestSchemaBehindBinary: a schema migrated by an older release (here: the
// last migration's row and objects removed) is refused before the first
// claim, so no handler runs whose Complete could not be stored; after
// Migrate the same Store claims.
func TestSchemaBehindBinary(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	s := newStore(t, pool)
	if _, err := pool.Exec(t.Context(), `DELETE FROM `+s.names.migrations+` WHERE table_name = $1 AND version = $2`, s.cfg.table, s.schemaVersion); err != nil {
		t.Fatal(err)
	}
	// The last migration (0006) only replaces the claim function, which
	// re-applying it replaces again: nothing else to undo.
	fresh, err := New(pool, WithSchema(s.cfg.schema))
	if err != nil {
		t.Fatal(err)
	}
	_, err = fresh.Claim(t.Context(), claimReq("k", time.Minute))
	requirePrefixed(t, err, "claim")
	if err == nil || !strings.Contains(err.Error(), "run pgstore.Migrate") || !strings.Contains(err.Error(), "needs") {
		t.Fatalf("claim on a schema behind the binary: %v", err)
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+s.names.table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d records (%v): the refused claim must not insert", n, err)
	}
	if err := Migrate(t.Context(), pool, WithSchema(s.cfg.schema)); err != nil {
		t.Fatal(err)
	}
	if res, err := fresh.Claim(t.Context(), claimReq("k", time.Minute)); err != nil || !res.Claimed {
		t.Fatalf("claim after Migrate: %v %v", res.Claimed, err)
	}
}

// TestUnstorableScope: PostgreSQL text cannot hold NUL or invalid UTF-8. A
// scope carrying either is refused with an error that says so (the engine
// answers 503, handler not run); it is never altered, since two distinct
// scopes must never become one.
func TestUnstorableScope(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgstoretest.Pool(t))
	for _, scope := range []string{"user-\xff", "user-\x00"} {
		req := claimReq("k", time.Minute)
		req.Scope = scope
		_, err := s.Claim(t.Context(), req)
		requirePrefixed(t, err, "claim")
		if err == nil || !strings.Contains(err.Error(), "not storable as PostgreSQL text") {
			t.Errorf("scope %q: %v", scope, err)
		}
	}
}
