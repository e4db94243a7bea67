package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestSentinelRealErrors drives the sentinel keys (1 to 255 bytes, quotes,
// backslashes) into PostgreSQL's real failures, in plain and transactional
// mode: a backend terminated while the claim or the commit waits on a row
// lock, and a lock timeout on both. Nothing the engine logs, observes,
// returns or answers may carry the key in any form.
func TestSentinelRealErrors(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []Option
	}{{"plain", nil}, {"transactional", []Option{WithTransactional()}}} {
		for _, s := range idemtest.SentinelKeys() {
			if !s.Valid {
				continue
			}
			t.Run(mode.name+"/"+s.Name, func(t *testing.T) {
				t.Parallel()
				for _, failure := range []string{"terminate", "lock_timeout"} {
					t.Run(failure, func(t *testing.T) { sentinelRealError(t, s.Key, failure, mode.opts) })
				}
			})
		}
	}
}

func sentinelRealError(t *testing.T, key, failure string, opts []Option) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	app := "idem-sentinel-" + hex.EncodeToString(b[:])
	cfg := pgstoretest.Config(t)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	if failure == "lock_timeout" {
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = "100ms"
	}
	// Migrated on the admin pool: the migration's advisory lock would hit
	// the lock timeout when tests run in parallel.
	admin := pgstoretest.Pool(t)
	opts = append([]Option{WithSchema(pgstoretest.Schema(t, admin))}, opts...)
	openStore(t, admin, opts...)
	s, err := New(pgstoretest.NewPool(t, cfg), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	table := pgx.Identifier{s.cfg.schema, s.cfg.table}.Sanitize()

	var c idemtest.Capture
	eng, err := core.New(s, append(c.Options(), core.WithLease(time.Minute),
		core.WithScope(func(context.Context, *core.Request) (string, error) { return "tenant", nil }))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	request := func() core.Request {
		return core.Request{Method: "POST", Route: "/pay", Target: "/pay", Body: strings.NewReader(`{"amount":1}`),
			Header: http.Header{"Idempotency-Key": {idemtest.HeaderValue(key)}}}
	}
	// lockRow holds the record's row lock in an admin transaction until
	// the returned function rolls it back.
	lockRow := func() func() {
		t.Helper()
		tx, err := admin.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM "+table+" WHERE scope = $1 AND key = $2 FOR UPDATE) l", "tenant", key).Scan(&n); err != nil || n != 1 {
			t.Fatalf("lock the record: %d rows, %v", n, err)
		}
		return func() { _ = tx.Rollback(context.Background()) }
	}
	// fails runs op while the row is locked: with "terminate", the store's
	// backend running op's statement is terminated; with "lock_timeout",
	// the wait ends by itself. op must fail.
	fails := func(what string, op func() error) {
		t.Helper()
		unlock := lockRow()
		defer unlock()
		done := make(chan error, 1)
		go func() { done <- op() }()
		if failure == "terminate" {
			deadline := time.Now().Add(30 * time.Second)
			for {
				var pid int
				err := admin.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'", app).Scan(&pid)
				if err == nil {
					if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
						t.Fatal(err)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s never reached the server: %v", what, err)
				}
				time.Sleep(5 * time.Millisecond) // polling the server's state, not standing in for it
			}
		}
		err := <-done
		if err == nil {
			t.Fatalf("%s succeeded through a %s", what, failure)
		}
		c.Err(err)
	}

	// The commit fails: the handler ran, its write is in the transaction
	// (transactional mode), the record's row is locked.
	d, err := eng.Decide(ctx, request())
	if err != nil || d.Outcome != core.Proceed {
		t.Fatalf("decide: %v %v", d.Outcome, err)
	}
	if s.cfg.transactional {
		tx, err := Tx(d.Context(ctx))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(d.Context(ctx), "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	fails("commit", func() error {
		err := eng.Commit(ctx, d, adapterkit.Response{Status: 201, Body: []byte(`{"id":1}`)})
		if err != nil {
			c.Text(err.Error()) // the answer's body is fixed text; the error reaches error handlers
		}
		return err
	})
	// The retry's claim fails the same way (the record is claimable: the
	// commit failed... or the terminated one is processing under a live
	// lease: release it first).
	if rec, err := s.Get(ctx, "tenant", key); err == nil && rec.Status == storekit.StatusProcessing {
		if err := s.Fail(ctx, storekit.Fence{Scope: "tenant", Key: key, Token: rec.Token}); err != nil {
			t.Fatal(err)
		}
	}
	fails("claim", func() error {
		d, err := eng.Decide(ctx, request())
		if d != nil && d.Response != nil {
			c.Text(string(d.Response.Body))
		}
		return err
	})

	out := c.String()
	sign := map[string]string{"terminate": "57P01", "lock_timeout": "55P03"}[failure]
	if !strings.Contains(out, sign) && !strings.Contains(out, "conn closed") && !strings.Contains(out, "unexpected EOF") {
		t.Errorf("no real %s error (SQLSTATE %s) was seen: the test proves nothing:\n%s", failure, sign, out)
	}
	if !strings.Contains(out, core.RedactKey(key)) {
		t.Errorf("the key's redacted form is nowhere: the engine logged nothing about it")
	}
	c.NoKey(t, key)
	if testing.Verbose() {
		t.Logf("%.600s", out)
	}
}
