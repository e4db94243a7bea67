package pgstore

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// sanitize is what headerJSON promises to store for s: every NUL and
// every invalid UTF-8 byte as U+FFFD, everything else as is.
func sanitize(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == 0 || (r == utf8.RuneError && size == 1) {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func checkHeaderJSON(t *testing.T, h map[string][]string) {
	t.Helper()
	out := []byte(headerJSON(h))
	if !json.Valid(out) {
		t.Fatalf("invalid JSON %q for %q", out, h)
	}
	if strings.Contains(string(out), `\u0000`) {
		t.Fatalf("NUL escape (jsonb refuses it) in %q", out)
	}
	var got map[string][]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	want := make(map[string][]string, len(h))
	for name, vals := range h {
		var w []string
		if vals != nil {
			w = make([]string, len(vals))
			for i, v := range vals {
				w[i] = sanitize(v)
			}
		}
		want[sanitize(name)] = w
	}
	if !sameHeaders(got, want) {
		t.Fatalf("round trip of %q: got %q, want %q", h, got, want)
	}
}

func TestHeaderJSON(t *testing.T) {
	for _, h := range []map[string][]string{
		{},
		{"Content-Type": {"application/json"}},
		{"Link": {`</a>; rel="a"`, `</b>; rel="b"`, ""}, "Etag": {`"v1"`}},
		{"X-Quote": {`a"b\c/d`}, "X-Ctl": {"tab\there\r\nnl\x01\x1f\x7f"}},
		{"X-Unicode": {"支払い ✓ 😀", "\u2028\u2029<>&"}},
		{"X-Nil": nil, "X-Empty": {}},
		{"X-Nul": {"a\x00b", "\x00"}, "X-Bad-Utf8": {"\xff\xfe", "ok\xc3", "\xed\xa0\x80"}},
	} {
		checkHeaderJSON(t, h)
	}
}

func FuzzHeaderJSON(f *testing.F) {
	f.Add("Content-Type", "application/json", "")
	f.Add("X-A", "a\x00b\xff", "\"\\\n")
	f.Fuzz(func(t *testing.T, name, v1, v2 string) {
		checkHeaderJSON(t, map[string][]string{name: {v1, v2}, "X-Fixed": {v2}})
	})
}

// sameHeaders reports whether a and b hold the same names and values, nil
// (JSON null) and empty ([]) told apart.
func sameHeaders(a, b map[string][]string) bool {
	return maps.EqualFunc(a, b, func(x, y []string) bool { return slices.Equal(x, y) && (x == nil) == (y == nil) })
}

// TestStoredHeadersRoundTrip: headers PostgreSQL's jsonb would refuse as
// encoding/json writes them (NUL) or that need escapes are stored, and a
// replay reads back what headerJSON promises, by both read paths: the
// claim function's binary row and the text one.
func TestStoredHeadersRoundTrip(t *testing.T) {
	h := map[string][]string{
		"Link":       {`</a>; rel="a"`, ""},
		"X-Odd":      {"a\x00b\xff", "\u2028<>&", `back\slash`},
		"X-Nil":      nil,
		"X-Unicode":  {"支払い ✓ 😀"},
		"X-Nul\x00N": {"v"},
	}
	want := map[string][]string{
		"Link":         {`</a>; rel="a"`, ""},
		"X-Odd":        {"a\ufffdb\ufffd", "\u2028<>&", `back\slash`},
		"X-Nil":        nil,
		"X-Unicode":    {"支払い ✓ 😀"},
		"X-Nul\ufffdN": {"v"},
	}
	for _, mode := range []struct {
		name     string
		execMode pgx.QueryExecMode
	}{{"extended", 0}, {"simple_protocol", pgx.QueryExecModeSimpleProtocol}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgstoretest.Config(t)
			if mode.execMode != 0 {
				cfg.ConnConfig.DefaultQueryExecMode = mode.execMode
			}
			s := newStore(t, pgstoretest.NewPool(t, cfg))
			ctx := t.Context()
			req := claimReq("k", time.Minute)
			res, err := s.Claim(ctx, req)
			require.NoError(t, err)
			require.True(t, res.Claimed)
			f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
			require.NoError(t, s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Header: h, Body: []byte("{}")}))
			res, err = s.Claim(ctx, req)
			require.NoError(t, err)
			require.NotNil(t, res.Record.Response)
			got := res.Record.Response.Header
			assert.True(t, sameHeaders(got, want), "got %q, want %q", got, want)
		})
	}
}
