package main

import (
	"bytes"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// TestRestartReplays is the fresh-clone check of the embedded default: the
// binary with no -dsn (and no $DATABASE_URL) takes a payment, is killed,
// starts again on the same default file, and answers the retry with the
// stored 201 and Idempotent-Replayed: true; the ledger still holds exactly
// one payment. The user's cache directory is pointed at a temporary one.
func TestRestartReplays(t *testing.T) {
	bin := buildBinary(t)
	home := t.TempDir()
	env := []string{"XDG_CACHE_HOME=" + home, "HOME=" + home, "LocalAppData=" + home}
	user, key, body := "u-"+randomID(), "k-"+randomID(), paymentBody(1000)

	first := startProcess(t, bin, env, "-provider-latency", "0s")
	paid := mustDo(t, http.MethodPost, first.base+"/v1/payments", user, key, body)
	if paid.status != http.StatusCreated || paid.replayed {
		t.Fatalf("first POST: %d (replayed %v) %s, want a fresh 201", paid.status, paid.replayed, paid.body)
	}
	first.kill()

	matches, _ := filepath.Glob(filepath.Join(home, "*", "idem", "payments.db"))
	matches2, _ := filepath.Glob(filepath.Join(home, "idem", "payments.db"))
	if len(matches)+len(matches2) == 0 {
		t.Errorf("no idem/payments.db under the cache directory %s", home)
	}

	second := startProcess(t, bin, env, "-provider-latency", "0s")
	retry := mustDo(t, http.MethodPost, second.base+"/v1/payments", user, key, body)
	if retry.status != http.StatusCreated || !retry.replayed || !bytes.Equal(retry.body, paid.body) {
		t.Fatalf("retry after the restart: %d (replayed %v) %s; want the stored 201 %s, replayed", retry.status, retry.replayed, retry.body, paid.body)
	}
	if ps := listPayments(t, second.base, user); len(ps) != 1 {
		t.Errorf("ledger holds %d payments after the restart, want 1", len(ps))
	}
}

// TestSQLiteDSN: which -dsn values select the SQLite file, and which.
func TestSQLiteDSN(t *testing.T) {
	for dsn, want := range map[string]string{
		"":                defaultSQLitePath(),
		"sqlite:///tmp/x": "/tmp/x",
		"sqlite://rel.db": "rel.db",
		"mem:":            "",
		"postgres://h/db": "",
		"mysql://u@h/db":  "",
		"sqlite-ish://x":  "",
	} {
		got, ok := sqlitePath(dsn)
		if ok != (want != "") || got != want {
			t.Errorf("sqlitePath(%q) = %q, %v; want %q", dsn, got, ok, want)
		}
	}
	if filepath.Base(defaultSQLitePath()) != "payments.db" || filepath.Base(filepath.Dir(defaultSQLitePath())) != "idem" {
		t.Errorf("default path %q, want .../idem/payments.db", defaultSQLitePath())
	}
	if _, _, _, err := openSQLite(t.Context(), "", time.Hour); err == nil {
		t.Error("-dsn sqlite:// with no path accepted")
	}
}
