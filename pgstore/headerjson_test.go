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

func TestParseHeaderJSON(t *testing.T) {
	for _, in := range []string{
		`{}`, ` { } `,
		`{"Content-Type": ["application/json"]}`,
		`{"Link": ["</a>; rel=\"a\"", "</b>; rel=\"b\"", ""], "Etag": ["\"v1\""], "Location": ["/v1/payments/pay_1"]}`,
		`{"X-Esc": ["tab\there", "nl\n", "\u00e9\ud83d\ude00", "\/slash", "\\back"]}`,
		`{"X-Unicode": ["支払い ✓"]}`,
		`{"X-Nil": null, "X-Empty": []}`,
		"{\n\t\"A\" :\r [ \"b\" , \"c\" ] \n}",
		`{"Dup": ["a"], "Dup": ["b"]}`,
	} {
		got, err := parseHeaderJSON([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		var want map[string][]string
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("%s: encoding/json: %v", in, err)
		}
		if !sameHeaders(got, want) {
			t.Errorf("%s: got %q, want %q", in, got, want)
		}
	}
	for _, in := range []string{``, `[]`, `{"A": "b"}`, `{"A": [1]}`, `{"A": ["b"]`, `{"A": ["b"]} x`, `{"A": ["b",]}`, `{"A" ["b"]}`, "{\"A\": [\"\x01\"]}", `{"A": [null]}`} {
		if h, err := parseHeaderJSON([]byte(in)); err == nil {
			t.Errorf("%q parsed as %q, want an error (and the encoding/json fallback)", in, h)
		}
	}
	// What the store writes, it reads.
	h := map[string][]string{"Link": {`</a>; rel="a"`, ""}, "X-Odd": {"a\x00b\xff", "\u2028"}, "X-Nil": nil}
	got, err := parseHeaderJSON(appendHeaderJSON(nil, h))
	if err != nil {
		t.Fatal(err)
	}
	if v := got["X-Odd"]; len(v) != 2 || v[0] != "a\ufffdb\ufffd" || got["X-Nil"] != nil || len(got["Link"]) != 2 {
		t.Fatalf("round trip: %q", got)
	}
	// Values are capped: appending to one header's values must not
	// overwrite the next one's.
	got, _ = parseHeaderJSON([]byte(`{"A": ["1"], "B": ["2"]}`))
	_ = append(got["A"], "x")
	if got["B"][0] != "2" {
		t.Fatalf("append to A overwrote B: %q", got)
	}
}

// FuzzParseHeaderJSON: whatever the hand-written parser accepts,
// encoding/json accepts too, with the same result.
func FuzzParseHeaderJSON(f *testing.F) {
	f.Add([]byte(`{"Content-Type": ["application/json"], "Link": ["a", "b\"c"]}`))
	f.Add([]byte(`{"X": null, "Y": [], "Z": ["\u00e9\ud83d\ude00\n"]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := parseHeaderJSON(in)
		if err != nil {
			return
		}
		var want map[string][]string
		if err := json.Unmarshal(in, &want); err != nil {
			t.Fatalf("%q: parsed as %q, encoding/json refuses it: %v", in, got, err)
		}
		if !sameHeaders(got, want) {
			t.Fatalf("%q: got %q, encoding/json %q", in, got, want)
		}
	})
}
