package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
)

// TestSentinelKeys: idemctl's output and errors never show a key (1 to 255
// bytes, quotes, backslashes; in any escaped form) unless asked to: on
// every command touching one record, on refusals and store errors, on a
// key mistaken for a flag or a command, and on a key read from stdin.
func TestSentinelKeys(t *testing.T) {
	backends(t, func(t *testing.T, c ctl, st core.Store) {
		keys := idemtest.SentinelKeys()
		keys = append(keys, idemtest.Sentinel{Name: "dash", Key: "-SENTINEL-dash", Valid: true})
		// The non-ASCII key too: no request can carry it, but an operator
		// can type it.
		for _, s := range keys {
			t.Run(s.Name, func(t *testing.T) {
				var out idemtest.Capture
				run := func(stdin string, args ...string) int {
					t.Helper()
					var o, e bytes.Buffer
					code := run(context.Background(), args, strings.NewReader(stdin), &o, &e)
					out.Text(o.String())
					out.Text(e.String())
					return code
				}
				db := func(args ...string) []string {
					return append(append([]string{args[0]}, c.db...), args[1:]...)
				}
				// A stuck record (its lease lapsed) and a live one.
				stuck := claim(t, st, "u-stuck", s.Key, time.Microsecond, time.Hour)
				claim(t, st, "u-live", s.Key, time.Hour, time.Hour)
				for _, json := range []string{"-json=false", "-json"} {
					run("", db("inspect", json, "-body", "-scope", "u-stuck", "--", s.Key)...)
					run("", db("inspect", json, "-scope", "u-missing", "--", s.Key)...)
					run("", db("stuck", json)...)
					run("", db("release", json, "-scope", "u-live", "--", s.Key)...)                                    // refused: live lease
					run("", db("release", json, "-scope", "u-stuck", "-token", itoa(stuck.Token+1000), "--", s.Key)...) // refused: wrong token
				}
				if code := run("", db("release", "-scope", "u-stuck", "-token", itoa(stuck.Token), "--", s.Key)...); code != exitOK {
					t.Errorf("release: exit %d", code)
				}
				if code := run(s.Key+"\n", db("inspect", "-scope", "u-stuck", "-")...); code != exitOK {
					t.Errorf("inspect from stdin: exit %d", code)
				}
				// Store errors: a schema that does not exist.
				bad := append([]string{"inspect"}, c.db...)
				if c.db[0] == "-dsn" {
					bad = append(bad, "-schema", "no_such_schema")
				} else {
					bad = append(bad, "-table", "no_such_table")
				}
				if code := run("", append(bad, "-scope", "u", "--", s.Key)...); code == exitOK {
					t.Errorf("inspect on a missing table succeeded")
				}
				// The key mistaken for a flag, or for the command.
				run("", db("inspect", "-scope", "u", s.Key)...)
				run("", s.Key)
				run("", s.Key, "-scope", "u")

				text := out.String()
				if !strings.Contains(text, core.RedactKey(s.Key)) {
					t.Errorf("the key hash is nowhere: the commands did not run:\n%s", text)
				}
				out.NoKey(t, s.Key)
			})
		}
	})
}

// TestFailScrubs: the second wall. No store error names a key (the test
// above shows it on the real ones), but should one, fail prints it
// scrubbed, in every escaped form.
func TestFailScrubs(t *testing.T) {
	for _, s := range idemtest.SentinelKeys() {
		var e bytes.Buffer
		c := &cli{stderr: &e, secret: s.Key}
		c.fail(exitFailure, fmt.Errorf("store: no row for key %q (raw %s)", s.Key, s.Key))
		if !strings.Contains(e.String(), core.RedactKey(s.Key)) {
			t.Errorf("%s: %q lacks the key's hash", s.Name, e.String())
		}
		for _, l := range idemtest.KeyLeaks(e.String(), s.Key) {
			t.Errorf("%s: the raw key leaked: %s", s.Name, l)
		}
	}
}
