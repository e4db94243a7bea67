package core_test

// Bad input at the engine's edge: keys, bodies and fingerprints. The HTTP
// side of the same cases is in nethttpidem/fault_test.go.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

func TestBadInputParseKey(t *testing.T) {
	k255 := strings.Repeat("a", 255)
	cases := []struct {
		name   string
		values []string
		want   string // "" means an error
		miss   bool   // ErrKeyMissing rather than ErrKeyInvalid
	}{
		{"no header", nil, "", true},
		{"0 bytes", []string{""}, "", false},
		{"whitespace only", []string{" \t "}, "", false},
		{"1 byte", []string{"a"}, "a", false},
		{"255 bytes", []string{k255}, k255, false},
		{"256 bytes", []string{k255 + "a"}, "", false},
		{"64 KiB", []string{strings.Repeat("a", 64<<10)}, "", false},
		{"64 KiB quoted", []string{`"` + strings.Repeat("a", 64<<10) + `"`}, "", false},
		{"255 bytes quoted", []string{`"` + k255 + `"`}, k255, false},
		{"256 bytes quoted", []string{`"` + k255 + `a"`}, "", false},
		{"255 escaped bytes (512 on the wire)", []string{`"` + strings.Repeat(`\"`, 255) + `"`}, strings.Repeat(`"`, 255), false},
		{"256 escaped bytes", []string{`"` + strings.Repeat(`\"`, 256) + `"`}, "", false},
		{"surrounding whitespace trimmed", []string{" \tabc\t "}, "abc", false},
		{"non-ASCII UTF-8", []string{"ключ"}, "", false},
		{"non-ASCII quoted", []string{`"ключ"`}, "", false},
		{"invalid UTF-8", []string{"a\xffb"}, "", false},
		{"NUL", []string{"a\x00b"}, "", false},
		{"NUL quoted", []string{"\"a\x00b\""}, "", false},
		{"DEL", []string{"a\x7fb"}, "", false},
		{"DEL quoted", []string{"\"a\x7fb\""}, "", false},
		{"CR LF injection", []string{"a\r\nSet-Cookie: x"}, "", false},
		{"ESC", []string{"a\x1b[31mb"}, "", false},
		{"tab inside", []string{"a\tb"}, "", false},
		{"space inside", []string{"a b"}, "", false},
		{"space inside quoted", []string{`"a b"`}, "a b", false},
		{"quoted", []string{`"abc"`}, "abc", false},
		{"escaped quote", []string{`"a\"b"`}, `a"b`, false},
		{"escaped backslash", []string{`"a\\b"`}, `a\b`, false},
		{"invalid escape", []string{`"a\tb"`}, "", false},
		{"escape at end", []string{`"abc\"`}, "", false},
		{"unterminated", []string{`"abc`}, "", false},
		{"lone quote", []string{`"`}, "", false},
		{"empty quoted", []string{`""`}, "", false},
		{"parameters", []string{`"abc";a=1`}, "", false},
		{"list", []string{`"a", "b"`}, "", false},
		{"unquoted list", []string{"a,b"}, "", false},
		{"unquoted quote", []string{`a"`}, "", false},
		{"unquoted backslash", []string{`a\b`}, "", false},
		{"sf token characters", []string{"a:b/c;d=e*f"}, "a:b/c;d=e*f", false},
		{"several lines", []string{"a", "b"}, "", false},
		{"several identical lines", []string{"a", "a"}, "", false},
		{"several lines, one empty", []string{"a", ""}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := core.ParseKey(tc.values)
			if tc.want != "" {
				if err != nil || got != tc.want {
					t.Fatalf("ParseKey = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseKey = %q, want an error", got)
			}
			want := core.ErrKeyInvalid
			if tc.miss {
				want = core.ErrKeyMissing
			}
			if !errors.Is(err, want) {
				t.Fatalf("error %v is not %v", err, want)
			}
			// The message explains; it never echoes the key.
			for _, v := range tc.values {
				if len(v) > 2 && strings.Contains(err.Error(), v) {
					t.Errorf("error echoes the key: %v", err)
				}
			}
		})
	}
}

func newBadInputEngine(t *testing.T, opts ...core.Option) (*core.Engine, *memstore.Store) {
	t.Helper()
	store := memstore.New()
	eng, err := core.New(store, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return eng, store
}

// TestBadInputDecideRawHeaders hands Decide header values no HTTP server
// would let through (control characters, CR LF): an adapter on a lenient
// server, or a test double, must still get 400 and nothing claimed.
func TestBadInputDecideRawHeaders(t *testing.T) {
	eng, store := newBadInputEngine(t)
	for _, v := range []string{"a\x00", "a\x01b", "\x7f", "a\r\nb", "a\nb", "\"a\rb\"", "a\x80b", "\xff\xfe"} {
		d, err := eng.Decide(context.Background(), core.Request{
			Method: "POST", Route: "/p", Header: http.Header{"Idempotency-Key": {v}}, Body: strings.NewReader("{}"),
		})
		if err != nil || d.Outcome != core.Reject || d.Response.Status != 400 {
			t.Errorf("key %q: %v, %+v", v, err, d)
			continue
		}
		var p problem.Details
		if err := json.Unmarshal(d.Response.Body, &p); err != nil || p.Type != problem.BaseURI+problem.InvalidKey {
			t.Errorf("key %q: problem %s (%v)", v, d.Response.Body, err)
		}
		if bytes.Contains(d.Response.Body, []byte(v)) {
			t.Errorf("key %q echoed in the problem", v)
		}
	}
	if store.Len() != 0 {
		t.Errorf("refused keys left %d records", store.Len())
	}
}

// badInputErrReader fails after giving n bytes: a client that goes away mid-body.
type badInputErrReader struct{ n int }

func (e *badInputErrReader) Read(p []byte) (int, error) {
	if e.n <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	m := min(e.n, len(p))
	for i := range m {
		p[i] = 'x'
	}
	e.n -= m
	return m, nil
}

func TestBadInputBodies(t *testing.T) {
	const limit = 100
	eng, store := newBadInputEngine(t, core.WithMaxRequestBytes(limit))
	decide := func(key string, body io.Reader) *core.Decision {
		t.Helper()
		d, err := eng.Decide(context.Background(), core.Request{
			Method: "POST", Route: "/p", Header: http.Header{"Idempotency-Key": {key}}, Body: body,
		})
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		return d
	}
	if d := decide("over", strings.NewReader(strings.Repeat("a", limit+1))); d.Outcome != core.Reject || d.Response.Status != 413 {
		t.Errorf("over the limit: %v %d", d.Outcome, d.Response.Status)
	}
	if d := decide("broken", &badInputErrReader{n: 10}); d.Outcome != core.Reject || d.Response.Status != 400 {
		t.Errorf("body that fails mid-way: %v %+v", d.Outcome, d.Response)
	}
	// A broken body over the limit is still 413: the limit is checked first.
	if d := decide("broken-big", &badInputErrReader{n: 10 * limit}); d.Outcome != core.Reject || d.Response.Status != 413 {
		t.Errorf("long broken body: %v %d", d.Outcome, d.Response.Status)
	}
	if store.Len() != 0 {
		t.Fatalf("refused bodies left %d records", store.Len())
	}
	d := decide("over", strings.NewReader(strings.Repeat("a", limit)))
	if d.Outcome != core.Proceed || len(d.Body) != limit {
		t.Fatalf("at the limit: %v, %d bytes", d.Outcome, len(d.Body))
	}
	if err := eng.Abort(context.Background(), d, nil); err != nil {
		t.Fatal(err)
	}
	d = decide("nil-body", nil)
	if d.Outcome != core.Proceed || d.Body == nil || len(d.Body) != 0 {
		t.Fatalf("nil body: %v %v", d.Outcome, d.Body)
	}
	if err := eng.Abort(context.Background(), d, nil); err != nil {
		t.Fatal(err)
	}
}

// badInputFP is the canonical-JSON fingerprint of body.
func badInputFP(body string) string {
	return core.Fingerprint(core.FingerprintInput{Method: "POST", Route: "/p", Body: []byte(body), CanonicalJSON: true})
}

// badInputStrictJSON reports whether body is one JSON value that every
// reader takes the same way: valid UTF-8, no U+FFFD (encoding/json's
// replacement for invalid bytes and lone surrogates), no duplicate keys.
// It is the test's oracle for when canonical JSON may merge two bodies.
func badInputStrictJSON(body string) (any, bool) {
	if !utf8.ValidString(body) || !json.Valid([]byte(body)) || strings.ContainsRune(body, utf8.RuneError) {
		return nil, false
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	var walk func() (any, bool)
	walk = func() (any, bool) {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '[' {
				var arr []any
				for dec.More() {
					v, ok := walk()
					if !ok {
						return nil, false
					}
					arr = append(arr, v)
				}
				_, err := dec.Token()
				return arr, err == nil
			}
			obj := map[string]any{}
			for dec.More() {
				k, err := dec.Token()
				ks, _ := k.(string)
				if err != nil || strings.ContainsRune(ks, utf8.RuneError) {
					return nil, false
				}
				if _, dup := obj[ks]; dup {
					return nil, false
				}
				v, ok := walk()
				if !ok {
					return nil, false
				}
				obj[ks] = v
			}
			_, err := dec.Token()
			return obj, err == nil
		case string:
			return t, !strings.ContainsRune(t, utf8.RuneError)
		default:
			return t, true
		}
	}
	v, ok := walk()
	if !ok {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return v, true
}

// checkCanonicalPair is the property: two different bodies share a
// canonical fingerprint only if both are strict JSON with equal values.
func checkCanonicalPair(t *testing.T, a, b string) {
	t.Helper()
	if a == b || badInputFP(a) != badInputFP(b) {
		return
	}
	va, oka := badInputStrictJSON(a)
	vb, okb := badInputStrictJSON(b)
	if !oka || !okb || !reflect.DeepEqual(va, vb) {
		t.Errorf("different requests share a fingerprint:\n  %q\n  %q", a, b)
	}
}

func TestBadInputCanonicalJSONNeverMergesDifferentRequests(t *testing.T) {
	differ := [][2]string{
		{"{\"to\":\"\xff\"}", "{\"to\":\"\xfe\"}"},
		{"{\"to\":\"\xff\"}", "{\"to\":\"\uFFFD\"}"},
		{`{"to":"\ud800"}`, `{"to":"\udc00"}`},
		{`{"to":"\ud800"}`, `{"to":"\ufffd"}`},
		{"{\"\xff\":1}", "{\"\xfe\":1}"},
		{`{"amount":1,"amount":50000}`, `{"amount":50000}`},
		{`{"amount":50000,"amount":1}`, `{"amount":1}`},
		{`{"a":{"x":1,"x":2}}`, `{"a":{"x":2}}`},
		{`{"amount":1}`, `{"amount":1.0}`},
		{`{"amount":1}`, `{"amount":1e0}`},
		{`{"n":12345678901234567890}`, `{"n":12345678901234567891}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":1}`, `{"a":1} {"a":1}`},
		{`{"a":1}`, `{"a":1}x`},
		{`{"a":null}`, `{}`},
		{`"a"`, `"a" `}, // same value, but whitespace after the value only differs: allowed to merge
	}
	for _, p := range differ {
		checkCanonicalPair(t, p[0], p[1])
	}
	// The known merges must be gone entirely, not just allowed by the oracle.
	for _, p := range differ[:8] {
		if badInputFP(p[0]) == badInputFP(p[1]) {
			t.Errorf("%q and %q share a fingerprint", p[0], p[1])
		}
	}
	// What canonical JSON is for still works: re-encoded retries match.
	same := [][2]string{
		{`{"amount":1000,"currency":"JPY","to":"alice"}`, "{\n  \"to\": \"alice\",\n  \"currency\": \"JPY\",\n  \"amount\": 1000\n}"},
		{`{"s":"\u00e9"}`, `{"s":"é"}`},
		{`{"s":"<&>"}`, `{"s":"\u003c\u0026\u003e"}`},
		{`[{"b":1,"a":[true,false,null]}]`, `[ { "a" : [ true , false , null ] , "b" : 1 } ]`},
	}
	for _, p := range same {
		if badInputFP(p[0]) != badInputFP(p[1]) {
			t.Errorf("re-encoded JSON does not match: %q vs %q", p[0], p[1])
		}
	}
	// Deep nesting falls back to raw bytes instead of failing.
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	rawFP := core.Fingerprint(core.FingerprintInput{Method: "POST", Route: "/p", Body: []byte(deep)})
	if badInputFP(deep) != rawFP {
		t.Errorf("deeply nested body: fingerprint is not the raw one")
	}
	if shallow := "[[1]]"; badInputFP(shallow) == core.Fingerprint(core.FingerprintInput{Method: "POST", Route: "/p", Body: []byte(shallow)}) {
		t.Errorf("shallow JSON fingerprinted raw under canonical JSON")
	}
}

// FuzzBadInputCanonicalJSON checks the no-merge property on arbitrary pairs
// and that whitespace-only re-encodings of strict JSON still match.
// Run: go test -run '^$' -fuzz FuzzBadInputCanonicalJSON ./core
func FuzzBadInputCanonicalJSON(f *testing.F) {
	f.Add("{\"to\":\"\xff\"}", "{\"to\":\"\xfe\"}")
	f.Add(`{"to":"\ud800"}`, `{"to":"\udc00"}`)
	f.Add(`{"amount":1,"amount":50000}`, `{"amount":50000}`)
	f.Add(`{"amount":1000,"to":"alice"}`, `{"to":"alice","amount":1000}`)
	f.Add(`[1,{"a":"b"}]`, `[1, {"a" : "b"}]`)
	f.Add(`{"a":1}`, `{"a":1.0}`)
	f.Fuzz(func(t *testing.T, a, b string) {
		checkCanonicalPair(t, a, b)
		if _, ok := badInputStrictJSON(a); ok {
			var ind bytes.Buffer
			if err := json.Indent(&ind, []byte(a), "", "  "); err != nil {
				t.Fatalf("json.Indent on strict JSON: %v", err)
			}
			if badInputFP(a) != badInputFP(ind.String()) {
				t.Errorf("indented strict JSON does not match: %q", a)
			}
		}
	})
}

// badInputShiftAlnum replaces each ASCII letter and digit with the next one
// (z->a, 9->0): the result is valid exactly when s is, and fails for the
// same reason.
func badInputShiftAlnum(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c < 'z', c >= 'A' && c < 'Z', c >= '0' && c < '9':
			b[i] = c + 1
		case c == 'z':
			b[i] = 'a'
		case c == 'Z':
			b[i] = 'A'
		case c == '9':
			b[i] = '0'
		}
	}
	return string(b)
}

// FuzzBadInputKeyHeader feeds arbitrary key header values to Decide: it
// never panics, refuses exactly what ParseKey refuses with a 400 that does
// not echo the value, claims nothing when it refuses, and accepts only
// 1 to 255 printable ASCII bytes that round-trip through the sf-string form.
// Run: go test -run '^$' -fuzz FuzzBadInputKeyHeader ./core
func FuzzBadInputKeyHeader(f *testing.F) {
	for _, s := range []string{"", "a", `"a"`, `"a\"b"`, `"a\\b"`, `"a\nb"`, "a,b", "a\x00", "ключ",
		strings.Repeat("k", 255), strings.Repeat("k", 256), `"` + strings.Repeat(`\\`, 255) + `"`, `"abc";x=1`} {
		f.Add(s, false)
	}
	f.Add("a", true)
	f.Fuzz(func(t *testing.T, v string, twoLines bool) {
		store := memstore.New()
		eng, err := core.New(store, core.WithSharedKeySpace())
		if err != nil {
			t.Fatal(err)
		}
		values := []string{v}
		if twoLines {
			values = append(values, v)
		}
		want, perr := core.ParseKey(values)
		d, err := eng.Decide(context.Background(), core.Request{
			Method: "POST", Route: "/p", Header: http.Header{"Idempotency-Key": values}, Body: strings.NewReader("{}"),
		})
		if err != nil {
			t.Fatalf("Decide error on a memstore: %v", err)
		}
		if perr != nil {
			if d.Outcome != core.Reject || d.Response.Status != 400 {
				t.Fatalf("invalid key %q: outcome %v", v, d.Outcome)
			}
			if store.Len() != 0 {
				t.Fatalf("invalid key %q claimed a record", v)
			}
			// The problem does not echo the key: changing its letters and
			// digits (which never decide validity) changes nothing.
			if v2 := badInputShiftAlnum(v); v2 != v {
				d2, err := eng.Decide(context.Background(), core.Request{
					Method: "POST", Route: "/p", Header: http.Header{"Idempotency-Key": {v2}}, Body: strings.NewReader("{}"),
				})
				if err == nil && d2.Outcome == core.Proceed { // two lines of a valid key, shifted to one line
					_ = eng.Abort(context.Background(), d2, nil)
				}
				if err != nil || !twoLines && !bytes.Equal(d2.Response.Body, d.Response.Body) {
					t.Fatalf("problem depends on the key's letters: %q -> %s, %q -> %s", v, d.Response.Body, v2, d2.Response.Body)
				}
			}
			return
		}
		if twoLines {
			t.Fatalf("two header lines accepted: %q", v)
		}
		if d.Outcome != core.Proceed || d.Key != want {
			t.Fatalf("valid key %q: outcome %v key %q, want %q", v, d.Outcome, d.Key, want)
		}
		if len(want) == 0 || len(want) > core.MaxKeyBytes {
			t.Fatalf("accepted key of %d bytes", len(want))
		}
		for i := 0; i < len(want); i++ {
			if want[i] < 0x20 || want[i] > 0x7e {
				t.Fatalf("accepted key with byte %#x", want[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(want) + `"`
		if back, err := core.ParseKey([]string{quoted}); err != nil || back != want {
			t.Fatalf("sf-string round trip of %q: %q, %v", want, back, err)
		}
		if err := eng.Abort(context.Background(), d, nil); err != nil {
			t.Fatal(err)
		}
	})
}
