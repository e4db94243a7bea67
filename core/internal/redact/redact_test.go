package redact

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestText: every form of the key goes, at every key length; short
// forms only where they stand alone, so messages stay readable.
func TestText(t *testing.T) {
	jsonOf := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	long := `k"\'<>&` + strings.Repeat("x", 255-8) + "9"
	cases := []struct {
		name, key, in, want string
	}{
		{"verbatim", "abcdefgh-1", "claim abcdefgh-1 failed", "claim ~ failed"},
		{"inside a word, long", "abcdefgh-1", "xabcdefgh-1x", "x~x"},
		{"go quoted", `ab"cd\ef`, fmt.Sprintf("key %q", `ab"cd\ef`), `key "~"`},
		{"go quoted twice", `ab"cd\ef`, fmt.Sprintf("%q", fmt.Sprintf("key %q", `ab"cd\ef`)), `"key \"~\""`},
		{"json", `a<b>&"c\d`, "key " + jsonOf(`a<b>&"c\d`), `key "~"`},
		{"sql doubled", `it's-a-key`, `WHERE k = 'it''s-a-key'`, `WHERE k = '~'`},
		{"mysql backslash", `it's\a"key`, `Duplicate entry 'it\'s\\a\"key' for key 'PRIMARY'`, `Duplicate entry '~' for key 'PRIMARY'`},
		{"url", "a b/c?d", "GET /x?k=a+b%2Fc%3Fd", "GET /x?k=~"},
		{"hex", "key-1234", "bytes " + hex.EncodeToString([]byte("key-1234")), "bytes ~"},
		{"hex upper", "key-1234", "0x" + strings.ToUpper(hex.EncodeToString([]byte("key-1234"))), "0x~"},
		{"1 byte alone", "a", `abort: key "a" (a) key=a`, `abort: key "~" (~) key=~`},
		{"1 byte in words", "a", "abort a banana", "abort ~ banana"},
		{"short with punctuation", `Z"\9`, `key "Z\"\\9" raw Z"\9.`, `key "~" raw ~.`},
		{"short key in a word", "ab1", "cab1 ab1x ab1", "cab1 ab1x ~"},
		{"short hex is a number", "Q", "file.go:51 +0x51", "file.go:51 +0x51"},
		{"255 bytes", long, "a " + fmt.Sprintf("%q", long) + " b " + jsonOf(long), `a "~" b "~"`},
		{"absent", "missing-key", "nothing here", "nothing here"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := strings.ReplaceAll(tc.want, "~", Key(tc.key))
			if got := Text(tc.in, tc.key); got != want {
				t.Errorf("Text(%q, %q)\n got %q\nwant %q", tc.in, tc.key, got, want)
			}
		})
	}
}

func TestError(t *testing.T) {
	base := errors.New("store down")
	err := fmt.Errorf("claim %q: %w", "k", base)
	got := Error(err, "k")
	if strings.Contains(got.Error(), `"k"`) || !strings.Contains(got.Error(), Key("k")) {
		t.Errorf("scrubError = %q", got)
	}
	if !errors.Is(got, base) {
		t.Errorf("scrubError hides the chain")
	}
	if clean := errors.New("nothing"); Error(clean, "k") != clean {
		t.Errorf("scrubError wrapped an error without the key")
	}
	if Error(nil, "k") != nil || Error(err, "") != err {
		t.Errorf("nil error or empty key not passed through")
	}
}

// TestTextCutShort: a database that truncates its message inside the key
// (MySQL keeps 128 characters of a SIGNAL's text) still shows most of it;
// 16 bytes or more of its beginning are scrubbed, fewer are left alone.
func TestTextCutShort(t *testing.T) {
	key := "pay-" + strings.Repeat("0123456789", 25)
	msg := "Error 1644 (45000): refused " + key[:120]
	if got := Text(msg, key); strings.Contains(got, key[:16]) || !strings.Contains(got, Key(key)) {
		t.Errorf("Text(%q) = %q: the cut key stays", msg, got)
	}
	quoted := fmt.Sprintf("claim %q", key)[:60] + " (truncated)"
	if got := Text(quoted, key); strings.Contains(got, key[:16]) {
		t.Errorf("Text(%q) = %q: the cut quoted key stays", quoted, got)
	}
	short := "refused " + key[:15]
	if got := Text(short, key); got != short {
		t.Errorf("Text(%q) = %q: 15 bytes are not the key", short, got)
	}
}
