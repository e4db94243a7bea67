package mysqlstore

import (
	"context"
	"log"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestSentinelRealErrors drives the sentinel keys (1 to 255 bytes, quotes,
// backslashes) into MariaDB's real failures: the store's own connection
// killed (KILL CONNECTION) while its claim or commit waits on a row lock,
// and a lock wait timeout (1205) on both. Nothing the engine logs,
// observes, returns or answers may carry the key in any form.
func TestSentinelRealErrors(t *testing.T) {
	for _, s := range idemtest.SentinelKeys() {
		if !s.Valid {
			continue
		}
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			for _, failure := range []string{"kill", "lock_wait_timeout"} {
				t.Run(failure, func(t *testing.T) { sentinelRealError(t, s.Key, failure) })
			}
		})
	}
}

func sentinelRealError(t *testing.T, key, failure string) {
	cfg := mysqlstoretest.Database(t, "")
	locker := mysqlstoretest.Open(t, cfg.Clone())
	admin := mysqlstoretest.Open(t, mysqlstoretest.Config(t, ""))
	if failure == "lock_wait_timeout" {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["innodb_lock_wait_timeout"] = "1"
	}
	var c idemtest.Capture
	// The driver's own log ("unexpected EOF" on a killed connection) is a
	// log line too.
	cfg.Logger = log.New(c.Writer(), "[mysql] ", 0)
	// No retries: the first 1205 is the error (retries would only repeat it).
	s := openStore(t, mysqlstoretest.Open(t, cfg), WithDeadlockRetries(0))

	eng, err := core.New(s, append(c.JSONOptions(), core.WithLease(time.Minute), // slog's JSON handler: its own escaping
		core.WithScope(func(context.Context, *core.Request) (string, error) { return "tenant", nil }))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	request := func() core.Request {
		return core.Request{Method: "POST", Route: "/pay", Target: "/pay", Body: strings.NewReader(`{"amount":1}`),
			Header: http.Header{"Idempotency-Key": {idemtest.HeaderValue(key)}}}
	}
	// fails runs op while another session of the test holds the record's
	// row lock: with "kill", the store's connection running op's statement
	// is killed (only that one: never the locker, never another test's);
	// with "lock_wait_timeout", the wait ends by itself. op must fail.
	fails := func(what string, op func() error) {
		t.Helper()
		tx, err := locker.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		var lockerID int64
		if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&lockerID); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT token FROM "+s.cfg.Table+" WHERE scope = ? AND `key` = ? FOR UPDATE) l", "tenant", key).Scan(&n); err != nil || n != 1 {
			t.Fatalf("lock the record: %d rows, %v", n, err)
		}
		done := make(chan error, 1)
		go func() { done <- op() }()
		if failure == "kill" {
			deadline := time.Now().Add(30 * time.Second)
			for {
				var id int64
				err := admin.QueryRowContext(ctx, "SELECT id FROM information_schema.PROCESSLIST WHERE db = ? AND id <> ? AND command IN ('Query', 'Execute')",
					cfg.DBName, lockerID).Scan(&id)
				if err == nil {
					if _, err := admin.ExecContext(ctx, "KILL CONNECTION ?", id); err != nil {
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
		err = <-done
		if err == nil {
			t.Fatalf("%s succeeded through a %s", what, failure)
		}
		c.Err(err)
	}

	d, err := eng.Decide(ctx, request())
	if err != nil || d.Outcome != core.Proceed {
		t.Fatalf("decide: %v %v", d.Outcome, err)
	}
	fails("commit", func() error {
		err := eng.Commit(ctx, d, adapterkit.Response{Status: 201, Body: []byte(`{"id":1}`)})
		if err != nil {
			c.Text(err.Error()) // the answer's body is fixed text; the error reaches error handlers
		}
		return err
	})
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
	sign := map[string]string{"kill": "invalid connection", "lock_wait_timeout": "1205"}[failure]
	if !strings.Contains(out, sign) && !strings.Contains(out, "bad connection") && !strings.Contains(out, "1927") && !strings.Contains(out, "1317") {
		t.Errorf("no real %s error (%s) was seen: the test proves nothing:\n%s", failure, sign, out)
	}
	if !strings.Contains(out, core.RedactKey(key)) {
		t.Errorf("the key's redacted form is nowhere: the engine logged nothing about it")
	}
	c.NoKey(t, key)
	if testing.Verbose() {
		t.Logf("%.600s", out)
	}
}
