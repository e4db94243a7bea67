package pgstore

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// sanitize is what appendJSONString promises to store for s: every NUL and
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
	out := appendHeaderJSON(nil, h)
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
	if !maps.EqualFunc(got, want, func(a, b []string) bool { return slices.Equal(a, b) && (a == nil) == (b == nil) }) {
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
