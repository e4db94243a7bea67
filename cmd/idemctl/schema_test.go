package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// schemaSQL runs `idemctl schema args...` and returns what it printed.
func schemaSQL(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), append([]string{"schema"}, args...), strings.NewReader(""), &out, &errb); code != exitOK {
		t.Fatalf("idemctl schema %v: exit %d: %s", args, code, errb.String())
	}
	return out.String()
}

// client runs a database's own command-line client with script on stdin:
// the printed SQL must be what the standard tools take as it is.
func client(t *testing.T, script string, name string, args ...string) {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s (the database's client) not found: install postgresql-client / mariadb-client: %v", name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s with the printed schema: %v\n%s", name, err, out)
	}
}

// roundTrip claims a key, completes it, and checks the retry replays.
func roundTrip(t *testing.T, st core.Store) {
	t.Helper()
	ctx := context.Background()
	req := storekit.ClaimRequest{Scope: "u1", Key: "k-1", Method: "POST", Route: "/pay", Fingerprint: "fp",
		Lease: time.Minute, Retention: time.Hour}
	res, err := st.Claim(ctx, req)
	if err != nil || !res.Claimed {
		t.Fatalf("first claim: %v %+v", err, res)
	}
	f := storekit.Fence{Scope: "u1", Key: "k-1", Token: res.Record.Token}
	if err := st.Complete(ctx, f, storekit.StoredResponse{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"pay_1"}`)}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	again, err := st.Claim(ctx, req)
	if err != nil || again.Claimed || again.Record.Status != storekit.StatusCompleted || again.Record.Response == nil ||
		string(again.Record.Response.Body) != `{"id":"pay_1"}` {
		t.Fatalf("retry: want the stored response, got %v %+v", err, again)
	}
}

// TestSchemaPostgres: the printed SQL, applied by psql to a fresh schema,
// makes a store New accepts, that claims, completes and replays, that
// Migrate finds up to date, and that idemctl operates on.
func TestSchemaPostgres(t *testing.T) {
	for _, mode := range []struct {
		name string
		args []string
		opts []pgstore.Option
	}{
		{"plain", nil, nil},
		{"partitioned", []string{"-partitioned"}, []pgstore.Option{pgstore.WithPartitioning(2)}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			pool := pgstoretest.Pool(t)
			schema := pgstoretest.Schema(t, pool)
			script := schemaSQL(t, append([]string{"postgres", "-schema", schema, "-table", "payments_idem"}, mode.args...)...)
			client(t, script, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", "-d", pgstoretest.DSN(), "-f", "-")

			opts := append([]pgstore.Option{pgstore.WithSchema(schema), pgstore.WithTable("payments_idem")}, mode.opts...)
			ctx := context.Background()
			st, err := pgstore.New(pool, opts...)
			if err != nil {
				t.Fatalf("New on the printed schema: %v", err)
			}
			t.Cleanup(st.Close)
			roundTrip(t, st)
			if err := pgstore.Migrate(ctx, pool, opts...); err != nil {
				t.Fatalf("Migrate after the printed schema: %v", err)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".idem_schema_migrations`).Scan(&n); err != nil || n != 6 {
				t.Errorf("migrations recorded: %d %v, want 6 (Migrate applied nothing again)", n, err)
			}
			c := ctl{t: t, db: []string{"-dsn", pgstoretest.DSN(), "-schema", schema, "-table", "payments_idem"}}
			if r := c.run("stats"); r.code != exitOK {
				t.Errorf("idemctl stats on the printed schema: exit %d %s", r.code, r.stderr)
			}
		})
	}
}

// TestSchemaMySQL: the same on a fresh MariaDB database, through the
// mysql client (DELIMITER and all).
func TestSchemaMySQL(t *testing.T) {
	cfg := mysqlstoretest.Database(t, "")
	script := schemaSQL(t, "mysql", "-table", "payments_idem")
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--protocol=TCP", "-h", host, "-P", port, "-u", cfg.User, "--batch"}
	if cfg.Passwd != "" {
		args = append(args, "--password="+cfg.Passwd)
	}
	client(t, script, "mysql", append(args, cfg.DBName)...)

	db := mysqlstoretest.Open(t, cfg)
	st, err := mysqlstore.New(db, mysqlstore.WithTable("payments_idem"))
	if err != nil {
		t.Fatalf("New on the printed schema: %v", err)
	}
	roundTrip(t, st)
	ctx := context.Background()
	if err := mysqlstore.Migrate(ctx, db, mysqlstore.WithTable("payments_idem")); err != nil {
		t.Fatalf("Migrate after the printed schema: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_schema_migrations").Scan(&n); err != nil || n != 7 {
		t.Errorf("migrations recorded: %d %v, want 7", n, err)
	}
	// The procedures kept the sql_mode the script set, not the session's default.
	for _, proc := range []string{"payments_idem_claim_v3", "payments_idem_claim_new"} {
		var mode string
		if err := db.QueryRowContext(ctx, "SELECT sql_mode FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ?", proc).Scan(&mode); err != nil {
			t.Fatalf("claim procedure %s: %v", proc, err)
		}
		if mode != "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION" {
			t.Errorf("claim procedure %s: sql_mode %q, want Migrate's", proc, mode)
		}
	}
	c := ctl{t: t, db: []string{"-mysql", cfg.FormatDSN(), "-table", "payments_idem"}}
	if r := c.run("stats"); r.code != exitOK {
		t.Errorf("idemctl stats on the printed schema: exit %d %s", r.code, r.stderr)
	}
}

func TestSchemaUsage(t *testing.T) {
	for _, args := range [][]string{{}, {"oracle"}, {"mysql", "-partitioned"}, {"postgres", "mysql"}, {"postgres", "-table", "no-dashes"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"schema"}, args...), strings.NewReader(""), &out, &errb); code != exitUsage {
			t.Errorf("schema %v: exit %d, want %d (%s)", args, code, exitUsage, errb.String())
		}
	}
	if !strings.Contains(schemaSQL(t, "PostgreSQL"), "CREATE TABLE") || !strings.Contains(schemaSQL(t, "mariadb"), "DELIMITER ;;") {
		t.Error("aliases postgresql/mariadb do not print their store's schema")
	}
}
