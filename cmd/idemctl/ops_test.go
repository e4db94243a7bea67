package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestStuckFail: with -fail, stuck exits 5 while a record is stuck past
// its lease and 0 otherwise (a live lease is not stuck), so cron and
// alerting can act on the exit code; without -fail a listing succeeds.
func TestStuckFail(t *testing.T) { backends(t, testStuckFail) }

func testStuckFail(t *testing.T, c ctl, st core.Store) {
	if r := c.run("stuck", "-fail"); r.code != exitOK {
		t.Fatalf("empty store: stuck -fail exit %d, want 0: %s", r.code, r.stderr)
	}
	claim(t, st, "u1", "live-"+sentinel, time.Hour, 2*time.Hour)
	if r := c.run("stuck", "-fail"); r.code != exitOK {
		t.Fatalf("a live lease only: stuck -fail exit %d, want 0: %s", r.code, r.stderr)
	}
	// A lease of the databases' precision has lapsed by the next statement.
	claim(t, st, "u1", "stuck-"+sentinel, time.Microsecond, time.Hour)
	r := c.run("stuck", "-fail")
	if r.code != exitStuck {
		t.Fatalf("a stuck record: stuck -fail exit %d, want %d: %s", r.code, exitStuck, r.stderr)
	}
	if !strings.Contains(r.stdout, core.RedactKey("stuck-"+sentinel)) || !strings.Contains(r.stderr, "1 record(s) stuck") {
		t.Errorf("stuck -fail still lists what is stuck:\n%s%s", r.stdout, r.stderr)
	}
	var list []recordJSON
	r = c.run("stuck", "-fail", "-json")
	if r.code != exitStuck || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 {
		t.Errorf("stuck -fail -json: exit %d, %q", r.code, r.stdout)
	}
	if r := c.run("stuck"); r.code != exitOK {
		t.Errorf("stuck without -fail: exit %d, want 0", r.code)
	}
}

// mysqlURL turns the test server's configuration into the mysql:// form.
func mysqlURL(t *testing.T) (string, *mysqlstore.Store) {
	t.Helper()
	cfg := mysqlstoretest.Database(t, "")
	db := mysqlstoretest.Open(t, cfg)
	if err := mysqlstore.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	st, err := mysqlstore.New(db)
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	} else {
		u.User = url.User(cfg.User)
	}
	return u.String(), st
}

// TestMySQLByURL: the MySQL store is selected by a mysql:// URL, in -dsn or
// in DATABASE_URL, as PostgreSQL is by its URL.
func TestMySQLByURL(t *testing.T) {
	raw, st := mysqlURL(t)
	claim(t, st, "u1", "url-"+sentinel, time.Hour, 2*time.Hour)
	var s struct {
		Processing int `json:"processing"`
	}
	ctl{t: t, db: []string{"-dsn", raw}}.json(&s, "stats")
	t.Setenv("DATABASE_URL", raw)
	var r recordJSON
	ctl{t: t}.json(&r, "inspect", "-scope", "u1", "url-"+sentinel)
	if r.Status != storekit.StatusProcessing || r.KeyHash != core.RedactKey("url-"+sentinel) {
		t.Errorf("inspect through DATABASE_URL=mysql://...: %+v", r)
	}

	// A malformed URL is a failure that does not repeat the password.
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"stats", "-dsn", "mysql://app:hunter2@db.example"}, strings.NewReader(""), &out, &errb)
	if code == exitOK || strings.Contains(errb.String(), "hunter2") {
		t.Errorf("bad mysql URL: exit %d, %q", code, errb.String())
	}
}

func TestVersion(t *testing.T) {
	orig := buildInfo
	t.Cleanup(func() { buildInfo = orig })
	buildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{
			Main: debug.Module{Path: "github.com/idemkit/idem/cmd/idemctl", Version: "v0.4.1"},
			Deps: []*debug.Module{
				{Path: "github.com/idemkit/idem", Version: "v0.4.1"},
				{Path: "github.com/idemkit/idem/pgstore", Version: "v0.4.1"},
				{Path: "github.com/jackc/pgx/v5", Version: "v5.13.0"},
			},
		}, true
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"version"}, nil, &out, &errb); code != exitOK {
		t.Fatalf("version: exit %d %s", code, errb.String())
	}
	want := "idemctl v0.4.1 (go"
	if !strings.HasPrefix(out.String(), want) || !strings.Contains(out.String(), "github.com/idemkit/idem/pgstore v0.4.1") ||
		strings.Contains(out.String(), "pgx") {
		t.Errorf("version printed:\n%s", out.String())
	}
	out.Reset()
	var v versionJSON
	if code := run(context.Background(), []string{"version", "-json"}, nil, &out, &errb); code != exitOK ||
		json.Unmarshal(out.Bytes(), &v) != nil || v.Version != "v0.4.1" || v.Modules["github.com/idemkit/idem"] != "v0.4.1" {
		t.Errorf("version -json: %q", out.String())
	}
	// The real build info of the test binary: some version, never empty.
	buildInfo = orig
	out.Reset()
	if code := run(context.Background(), []string{"version"}, nil, &out, &errb); code != exitOK || !strings.HasPrefix(out.String(), "idemctl ") {
		t.Errorf("version (real build info): exit %d %q", code, out.String())
	}
}

// TestHelpListsExitCodes: -h names every exit code and shows examples.
func TestHelpListsExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, nil, &out, &errb); code != exitOK {
		t.Fatalf("-h: exit %d", code)
	}
	help := out.String() + errb.String()
	for _, want := range []string{"exit codes:", "  0  ", "  1  ", "  2  ", "  3  ", "  4  ", "  5  ", "examples:", "stuck -fail", "schema postgres", "mysql://"} {
		if !strings.Contains(help, want) {
			t.Errorf("-h lacks %q", want)
		}
	}
}
