package core

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// sfQuote encodes key as an RFC 8941 sf-string.
func sfQuote(key string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324", `"abc"`, `"a\"b\\c"`, " padded\t", `"sp ace"`,
		"", `""`, `"`, `"abc`, `"a\nb"`, `"a";p=1`, `"a", "b"`, "a,b", "a b", "a\x00", "clé", "\x7f",
		strings.Repeat("x", 255), strings.Repeat("x", 256), `"` + strings.Repeat(`\\`, 255) + `"`,
		`"` + strings.Repeat(`\\`, 256) + `"`, "\"\t\"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := parseKey([]string{v})
		if err != nil {
			if !errors.Is(err, ErrKeyInvalid) || errors.Is(err, ErrKeyMissing) {
				t.Fatalf("parseKey(%q): error %v does not wrap ErrKeyInvalid alone", v, err)
			}
			if key != "" {
				t.Fatalf("parseKey(%q) returned key %q with error %v", v, key, err)
			}
		} else {
			if len(key) < 1 || len(key) > MaxKeyBytes {
				t.Fatalf("parseKey(%q) accepted a %d-byte key", v, len(key))
			}
			for i := 0; i < len(key); i++ {
				if key[i] < 0x20 || key[i] > 0x7e {
					t.Fatalf("parseKey(%q) accepted key %q with byte %#x", v, key, key[i])
				}
			}
			// Re-quoted as an sf-string, the key parses to itself.
			if k2, err := parseKey([]string{sfQuote(key)}); err != nil || k2 != key {
				t.Fatalf("re-quoted key %q parsed to %q, %v", sfQuote(key), k2, err)
			}
			// A raw (unquoted) value is the key itself, trimmed.
			if trimmed := strings.Trim(v, " \t"); !strings.HasPrefix(trimmed, `"`) && trimmed != key {
				t.Fatalf("raw value %q parsed to %q", v, key)
			}
		}
		// Surrounding whitespace never changes the outcome.
		key2, err2 := parseKey([]string{" \t" + v + "\t "})
		if key2 != key || (err == nil) != (err2 == nil) {
			t.Fatalf("padding changed parseKey(%q): %q,%v vs %q,%v", v, key, err, key2, err2)
		}
		// Two lines are always refused.
		if k, err := parseKey([]string{v, v}); err == nil || !errors.Is(err, ErrKeyInvalid) {
			t.Fatalf("two lines %q accepted as %q (%v)", v, k, err)
		}
	})
}

func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/pay", []byte(`{"amount":1000,"to":"alice"}`), "POST", "/pay", []byte(`{ "to":"alice", "amount":1000 }`))
	f.Add("POST", "/pay", []byte(`{}`), "POST", "/pay", []byte(`{}}`))
	f.Add("POST", "/pa", []byte(`y`), "POST", "/pay", []byte(``))
	f.Add("POST", "/r", []byte("{\"a\":\"\xff\"}"), "POST", "/r", []byte("{\"a\":\"\xfe\"}"))
	f.Add("POST", "/r", []byte(`{"a":1,"a":2}`), "POST", "/r", []byte(`{"a":2}`))
	f.Add("PATCH", "/r", []byte(`[1,2.0,"\u00e9",null,true,{"z":[],"a":{}}]`), "patch", "/r", []byte(`[1,2.0,"é",null,true,{"a":{},"z":[]}]`))
	f.Add("POST", "/r", []byte(`{"a":"\ud800"}`), "POST", "/r", []byte(`{"a":"\udbff"}`))
	f.Fuzz(func(t *testing.T, m1, r1 string, b1 []byte, m2, r2 string, b2 []byte) {
		in1 := FingerprintInput{Method: m1, Route: r1, Body: b1}
		in2 := FingerprintInput{Method: m2, Route: r2, Body: b2}
		raw1, raw2 := Fingerprint(in1), Fingerprint(in2)
		if raw1 != Fingerprint(in1) {
			t.Fatal("Fingerprint is not deterministic")
		}
		if b, err := hex.DecodeString(raw1); err != nil || len(b) != 32 {
			t.Fatalf("fingerprint %q is not hex SHA-256", raw1)
		}
		// Fingerprint upper-cases the method; compare the same way.
		u1, u2 := strings.ToUpper(m1), strings.ToUpper(m2)
		sameReq := u1 == u2 && r1 == r2 && bytes.Equal(b1, b2)
		if sameReq != (raw1 == raw2) {
			t.Fatalf("raw fingerprints: same request %v but equal fingerprints %v", sameReq, raw1 == raw2)
		}

		in1.CanonicalJSON, in2.CanonicalJSON = true, true
		c1, c2 := Fingerprint(in1), Fingerprint(in2)
		if c1 != Fingerprint(in1) {
			t.Fatal("canonical Fingerprint is not deterministic")
		}
		canon1, ok1 := canonicalJSON(b1)
		canon2, ok2 := canonicalJSON(b2)
		if !ok1 && c1 != raw1 {
			t.Fatalf("non-canonical body %q: canonical fingerprint differs from raw", b1)
		}
		if ok1 {
			// Canonical form is a fixed point and is valid JSON.
			again, ok := canonicalJSON(canon1)
			if !ok || !bytes.Equal(again, canon1) {
				t.Fatalf("canonical form %q is not stable: %q, %v", canon1, again, ok)
			}
			if !json.Valid(canon1) {
				t.Fatalf("canonical form %q is not valid JSON", canon1)
			}
			// Re-encoding the same value (indented, another key order) does
			// not change the canonical fingerprint.
			var v any
			dec := json.NewDecoder(bytes.NewReader(b1))
			dec.UseNumber()
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("canonical body %q does not decode: %v", b1, err)
			}
			indented, err := json.MarshalIndent(v, " ", "\t")
			if err != nil {
				t.Fatal(err)
			}
			re := fingerprint(fingerprintInput{Method: m1, Route: r1, Body: indented, CanonicalJSON: true})
			if re != c1 {
				t.Fatalf("re-encoded %q (from %q) changed the canonical fingerprint", indented, b1)
			}
		}
		// Canonical mode merges two bodies only when both are JSON with the
		// same canonical form.
		if u1 == u2 && r1 == r2 {
			merged := c1 == c2
			want := bytes.Equal(b1, b2) || (ok1 && ok2 && bytes.Equal(canon1, canon2))
			if merged != want {
				t.Fatalf("canonical fingerprints of %q and %q: equal=%v, want %v", b1, b2, merged, want)
			}
		} else if c1 == c2 {
			t.Fatalf("different method/route share a canonical fingerprint")
		}
	})
}
