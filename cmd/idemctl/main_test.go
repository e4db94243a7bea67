package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
	"github.com/idemkit/idem/sqlitestore/sqlitestoretest"
)

// The tests run idemctl (in process, through run) against the real
// PostgreSQL (IDEM_TEST_PG_DSN, default pgstoretest.DefaultDSN; unreachable
// fails) on a fresh schema.

// sentinel is in every key: no output may contain it unless asked to.
const sentinel = "S3NT1NEL"

type ctl struct {
	t  *testing.T
	db []string // the flags naming the database
}

type result struct {
	code           int
	stdout, stderr string
}

func (c ctl) run(args ...string) result {
	c.t.Helper()
	cmd := args[0]
	full := append(append([]string{cmd}, c.db...), args[1:]...)
	var out, errb bytes.Buffer
	code := run(context.Background(), full, strings.NewReader(""), &out, &errb)
	r := result{code, out.String(), errb.String()}
	showing := false
	for _, a := range args {
		showing = showing || a == "-show-key" || a == "-show-keys"
	}
	if !showing && strings.Contains(r.stdout+r.stderr, sentinel) {
		c.t.Errorf("idemctl %v printed a raw key:\n%s%s", args, r.stdout, r.stderr)
	}
	return r
}

func (c ctl) json(v any, args ...string) {
	c.t.Helper()
	r := c.run(append(args, "-json")...)
	if r.code != exitOK {
		c.t.Fatalf("idemctl %v: exit %d: %s", args, r.code, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		c.t.Fatalf("idemctl %v: %v\n%s", args, err, r.stdout)
	}
}

// backends runs fn against pgstore (PostgreSQL) and mysqlstore (MariaDB),
// each on a fresh schema or database.
func backends(t *testing.T, fn func(t *testing.T, c ctl, st core.Store)) {
	t.Run("postgres", func(t *testing.T) {
		pool := pgstoretest.Pool(t)
		schema := pgstoretest.Schema(t, pool)
		ctx := context.Background()
		if err := pgstore.Migrate(ctx, pool, pgstore.WithSchema(schema)); err != nil {
			t.Fatal(err)
		}
		st, err := pgstore.New(pool, pgstore.WithSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		fn(t, ctl{t: t, db: []string{"-dsn", pgstoretest.DSN(), "-schema", schema}}, st)
	})
	t.Run("mariadb", func(t *testing.T) {
		cfg := mysqlstoretest.Database(t, "")
		db := mysqlstoretest.Open(t, cfg)
		if err := mysqlstore.Migrate(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		st, err := mysqlstore.New(db)
		if err != nil {
			t.Fatal(err)
		}
		fn(t, ctl{t: t, db: []string{"-mysql", cfg.FormatDSN()}}, st)
	})
	t.Run("sqlite", func(t *testing.T) {
		st := sqlitestoretest.Store(t)
		var path string
		if err := st.DB().QueryRow("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&path); err != nil {
			t.Fatal(err)
		}
		fn(t, ctl{t: t, db: []string{"-sqlite", path}}, st)
	})
}

func claim(t *testing.T, st core.Store, scope, key string, lease, retention time.Duration) storekit.Fence {
	t.Helper()
	res, err := st.Claim(context.Background(), storekit.ClaimRequest{Scope: scope, Key: key, Method: "POST", Route: "/pay",
		Fingerprint: "fp", Lease: lease, Retention: retention})
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %v %+v", err, res)
	}
	return storekit.Fence{Scope: scope, Key: key, Token: res.Record.Token}
}

func TestInspectStatsStuck(t *testing.T) { backends(t, testInspectStatsStuck) }

func testInspectStatsStuck(t *testing.T, c ctl, st core.Store) {
	ctx := context.Background()
	kDone, kStuck, kLive := "done-"+sentinel, "stuck-"+sentinel, "live-"+sentinel
	f := claim(t, st, "u1", kDone, time.Minute, time.Hour)
	if err := st.Complete(ctx, f, storekit.StoredResponse{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"pay_1"}`)}); err != nil {
		t.Fatal(err)
	}
	stuck := claim(t, st, "u1", kStuck, 100*time.Millisecond, time.Hour)
	claim(t, st, "u2", kLive, time.Hour, 2*time.Hour)
	time.Sleep(150 * time.Millisecond)

	var rec recordJSON
	c.json(&rec, "inspect", "-scope", "u1", kDone)
	if rec.Status != storekit.StatusCompleted || rec.Response == nil || rec.Response.Status != 201 ||
		rec.Response.Headers["Content-Type"][0] != "application/json" || rec.Response.BodyBytes != 14 || rec.Response.Body != nil ||
		rec.CompletedAt == nil || rec.KeyHash != core.RedactKey(kDone) || rec.Key != "" || rec.Token != f.Token {
		t.Errorf("inspect: %+v", rec)
	}
	c.json(&rec, "inspect", "-scope", "u1", "-body", "-show-key", kDone)
	if rec.Response == nil || rec.Response.Body == nil || *rec.Response.Body != `{"id":"pay_1"}` || rec.Key != kDone {
		t.Errorf("inspect -body -show-key: %+v", rec)
	}
	if r := c.run("inspect", "-scope", "u1", kDone); r.code != exitOK || !strings.Contains(r.stdout, "completed") ||
		strings.Contains(r.stdout, "pay_1") || !strings.Contains(r.stdout, "(hidden; -body shows it)") {
		t.Errorf("inspect (text): %d %s %s", r.code, r.stdout, r.stderr)
	}
	if ss, ok := st.(storekit.StepStore); ok {
		if err := ss.SaveStep(ctx, stuck, "charge", []byte(`{"id":"ch_1"}`)); err != nil {
			t.Fatal(err)
		}
	}
	c.json(&rec, "inspect", "-scope", "u1", kStuck)
	if rec.Status != storekit.StatusProcessing || !rec.Stuck || rec.LeaseLeft >= 0 {
		t.Errorf("inspect stuck: %+v", rec)
	}
	if _, ok := st.(storekit.StepStore); ok && (len(rec.Steps) != 1 || rec.Steps[0].Name != "charge" || rec.Steps[0].ResultBytes != 13 || rec.Steps[0].Result != nil) {
		t.Errorf("inspect stuck: steps %+v, want the charge step (13 bytes, hidden)", rec.Steps)
	}
	if r := c.run("inspect", "-scope", "u9", kDone); r.code != exitNotFound || !strings.Contains(r.stderr, core.RedactKey(kDone)) {
		t.Errorf("inspect of a missing record: exit %d, stderr %q", r.code, r.stderr)
	}

	var stuckList []recordJSON
	c.json(&stuckList, "stuck")
	if len(stuckList) != 1 || stuckList[0].KeyHash != core.RedactKey(kStuck) || stuckList[0].Token != stuck.Token || stuckList[0].Key != "" {
		t.Errorf("stuck: %+v", stuckList)
	}
	c.json(&stuckList, "stuck", "-show-keys")
	if len(stuckList) != 1 || stuckList[0].Key != kStuck {
		t.Errorf("stuck -show-keys: %+v", stuckList)
	}

	var stats statsJSON
	c.json(&stats, "stats")
	counts := map[storekit.Status]statusJSON{}
	for _, s := range stats.ByStatus {
		counts[s.Status] = s
	}
	if stats.Total != 3 || counts[storekit.StatusProcessing].Count != 2 || counts[storekit.StatusProcessing].Stuck != 1 ||
		counts[storekit.StatusCompleted].Count != 1 || counts[storekit.StatusCompleted].UnderMinute != 1 {
		t.Errorf("stats: %+v", stats)
	}
	if r := c.run("stats"); r.code != exitOK || !strings.Contains(r.stdout, "processing") {
		t.Errorf("stats (text): %d %s", r.code, r.stdout)
	}
}

// TestReleaseLetsRetryRun: an owner died holding a long lease; its retry
// gets 409 until an operator releases the key, then runs; the dead owner,
// had it been alive, could no longer commit.
func TestReleaseLetsRetryRun(t *testing.T) { backends(t, testReleaseLetsRetryRun) }

func testReleaseLetsRetryRun(t *testing.T, c ctl, st core.Store) {
	ctx := context.Background()
	key := "pay-" + sentinel
	eng, err := core.New(st, core.WithLease(time.Hour), core.WithRetention(2*time.Hour),
		core.WithScope(func(context.Context, *core.Request) (string, error) { return "u1", nil }))
	if err != nil {
		t.Fatal(err)
	}
	req := func() core.Request {
		return core.Request{Method: "POST", Route: "/pay", Target: "/pay", Header: http.Header{"Idempotency-Key": {key}},
			Body: strings.NewReader(`{"amount":1}`)}
	}
	// The first owner claims and "dies": its decision is never finished
	// (no heartbeat matters: the lease is an hour).
	d1, err := eng.Decide(ctx, req())
	if err != nil || d1.Outcome != core.Proceed {
		t.Fatalf("first: %v %v", err, d1.Outcome)
	}
	lease, _ := storekit.LeaseFromContext(d1.Context(ctx))
	dead := lease.Fence()
	if d, _ := eng.Decide(ctx, req()); d.Outcome != core.Reject || d.Response.Status != http.StatusConflict {
		t.Fatalf("retry before release: %v, want 409", d.Outcome)
	}

	if r := c.run("release", "-scope", "u1", key); r.code != exitRefused || !strings.Contains(r.stderr, "lease") {
		t.Errorf("release of a live lease without -live: exit %d %s", r.code, r.stderr)
	}
	if r := c.run("release", "-scope", "u1", "-token", "999999", "-live", key); r.code != exitRefused {
		t.Errorf("release under a wrong token: exit %d %s", r.code, r.stderr)
	}
	if r := c.run("release", "-scope", "u2", "-live", key); r.code != exitNotFound {
		t.Errorf("release of a missing record: exit %d %s", r.code, r.stderr)
	}
	if r := c.run("release", "-scope", "u1", "-live", "-json", key); r.code != exitOK || !strings.Contains(r.stdout, `"released": true`) {
		t.Fatalf("release -live: exit %d %s %s", r.code, r.stdout, r.stderr)
	}

	// The retry runs now, and completes.
	d2, err := eng.Decide(ctx, req())
	if err != nil || d2.Outcome != core.Proceed {
		t.Fatalf("retry after release: %v %v, want Proceed", err, d2.Outcome)
	}
	if err := eng.Commit(ctx, d2, adapterkit.Response{Status: 201, Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	// The released owner is fenced out: a late write changes nothing.
	if err := st.Complete(ctx, dead, storekit.StoredResponse{Status: 201, Body: []byte("zombie")}); !errors.Is(err, core.ErrLeaseLost) {
		t.Errorf("the released owner's commit: %v, want ErrLeaseLost", err)
	}
	if err := eng.Abort(ctx, d1, nil); !errors.Is(err, core.ErrLeaseLost) {
		t.Errorf("the released owner's abort: %v, want ErrLeaseLost", err)
	}
	// Releasing again under the old token is refused: the record moved on.
	if r := c.run("release", "-scope", "u1", "-token", itoa(dead.Token), "-live", key); r.code != exitRefused {
		t.Errorf("second release under the stale token: exit %d %s", r.code, r.stderr)
	}
	var rec recordJSON
	c.json(&rec, "inspect", "-scope", "u1", "-body", key)
	if rec.Status != storekit.StatusCompleted || rec.Response == nil || *rec.Response.Body != "ok" || rec.Token <= dead.Token {
		t.Errorf("after the retry: %+v", rec)
	}

	// A lapsed lease is released without -live; the key then shows failed.
	stuck := claim(t, st, "u1", "lapsed-"+sentinel, 100*time.Millisecond, time.Hour)
	time.Sleep(150 * time.Millisecond)
	if r := c.run("release", "-scope", "u1", "-token", itoa(stuck.Token), "lapsed-"+sentinel); r.code != exitOK {
		t.Errorf("release of a lapsed lease: exit %d %s", r.code, r.stderr)
	}
	c.json(&rec, "inspect", "-scope", "u1", "lapsed-"+sentinel)
	if rec.Status != storekit.StatusFailed {
		t.Errorf("released record: %s, want failed", rec.Status)
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestSweepMaintain(t *testing.T) { backends(t, testSweepMaintain) }

func testSweepMaintain(t *testing.T, c ctl, st core.Store) {
	ctx := context.Background()
	for _, k := range []string{"a-" + sentinel, "b-" + sentinel} {
		f := claim(t, st, "u1", k, 100*time.Millisecond, 3*time.Second)
		if err := st.Complete(ctx, f, storekit.StoredResponse{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	claim(t, st, "u1", "keep-"+sentinel, time.Minute, time.Hour)
	if r := c.run("sweep", "-margin", "0s"); r.code != exitOK || !strings.Contains(r.stdout, "deleted 0") {
		t.Errorf("sweep before expiry: %d %s %s", r.code, r.stdout, r.stderr)
	}
	time.Sleep(3200 * time.Millisecond) // past the 3s retention; long enough that a loaded machine does not expire them before the first sweep
	var out map[string]int
	c.json(&out, "sweep", "-margin", "1h")
	if out["deleted"] != 0 {
		t.Errorf("sweep within the margin deleted %d", out["deleted"])
	}
	c.json(&out, "sweep", "-margin", "0s", "-batch", "1")
	if out["deleted"] != 2 {
		t.Errorf("sweep deleted %d, want 2", out["deleted"])
	}
	if r := c.run("maintain"); r.code != exitOK {
		t.Errorf("maintain: %d %s", r.code, r.stderr)
	}
	var stats statsJSON
	c.json(&stats, "stats")
	if stats.Total != 1 {
		t.Errorf("after sweep: %+v", stats)
	}
}

func TestUsage(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{
		{}, {"frobnicate"}, {"inspect", "-dsn", "postgres://x/y"}, {"inspect", "-dsn", "postgres://x/y", "a", "b"},
		{"stuck", "-dsn", "postgres://x/y", "-limit", "0"}, {"inspect", "k1-" + sentinel},
	} {
		t.Setenv("DATABASE_URL", "")
		out.Reset()
		errb.Reset()
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, errb.String())
		}
		if strings.Contains(out.String()+errb.String(), sentinel) {
			t.Errorf("%v echoed the key: %s", args, errb.String())
		}
	}
	// Unreachable database: failure, key redacted.
	errb.Reset()
	code := run(context.Background(), []string{"inspect", "-dsn", "postgres://127.0.0.1:1/x?connect_timeout=2", "-scope", "u", "k-" + sentinel},
		strings.NewReader(""), &out, &errb)
	if code != exitFailure || strings.Contains(errb.String(), sentinel) {
		t.Errorf("unreachable: exit %d %s", code, errb.String())
	}
	// The key from stdin.
	backends(t, func(t *testing.T, c ctl, st core.Store) {
		claim(t, st, "u1", "stdin-"+sentinel, time.Minute, time.Hour)
		out.Reset()
		errb.Reset()
		code = run(context.Background(), append(append([]string{"inspect"}, c.db...), "-scope", "u1", "-json", "-"),
			strings.NewReader("stdin-"+sentinel+"\n"), &out, &errb)
		if code != exitOK || !strings.Contains(out.String(), core.RedactKey("stdin-"+sentinel)) {
			t.Errorf("key from stdin: exit %d %s %s", code, out.String(), errb.String())
		}
	})
}
