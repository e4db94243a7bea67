// Package redact keeps idempotency keys out of text: core.RedactKey and
// storekit.ScrubText are its public faces.
package redact

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// Keys stay out of text by two walls. First, idem never writes a key into
// text it produces: logs, events, errors, problem bodies and idemctl show
// RedactKey(key), and the stores' errors never name the key. Second, text
// that comes from elsewhere (a driver's error, a handler's panic value or
// error, a scope function's error) is scrubbed with ScrubText before idem
// logs it, reports it or hands it on.

// scrubAlone is the length under which a form of the key counts only where
// it stands alone: "a" inside "abort" is chance, not the key "a".
const scrubAlone = 8

// scrubPrefix is the length from which a prefix of a form counts as the
// key: text from elsewhere may be cut short inside the key (MySQL keeps the
// first 128 characters of a SIGNAL's message), and 16 bytes of a key are
// already too much to show.
const scrubPrefix = 16

// Text returns s with every occurrence of key replaced by
// RedactKey(key). It finds the key in each form text carries it in:
// verbatim; escaped as Go does (%q, strconv.Quote, strconv.QuoteToASCII),
// as JSON does (with and without HTML escaping), as SQL literals do
// (quotes doubled; MySQL's backslash escapes), as URLs do (query and path
// escaping), each of these applied twice (a quoted message quoted again);
// and hex-encoded, upper or lower case.
//
// Text cut short inside the key still shows it: 16 bytes or more of the
// beginning of any of these forms are replaced too.
//
// A form shorter than 8 bytes is replaced only where it stands alone: not
// preceded or followed by a letter or digit where the form itself begins
// or ends with one (a 1-byte key "a" is scrubbed from `key "a"`, `key=a`
// and `(a)`, not from "abort"). Hex forms shorter than 8 digits are not
// searched: they read as numbers (line numbers, counts), not as keys. So
// for a key of a few bytes the guarantee is the first wall (idem never
// names it) and, in text from elsewhere, every standalone occurrence.
func Text(s, key string) string {
	if key == "" || s == "" {
		return s
	}
	forms := keyForms(key)
	if !anyForm(s, forms) {
		return s
	}
	red := Key(key)
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		n := matchAt(s, i, forms)
		if n == 0 {
			b.WriteByte(s[i])
			i++
			continue
		}
		b.WriteString(red)
		i += n
	}
	return b.String()
}

// Error returns err with its message scrubbed of key (see Text);
// errors.Is and errors.As still see the original chain. It returns err
// itself when the message holds no form of the key.
func Error(err error, key string) error {
	if err == nil || key == "" {
		return err
	}
	msg := err.Error()
	out := Text(msg, key)
	if out == msg {
		return err
	}
	return &scrubbedError{msg: out, err: err}
}

type scrubbedError struct {
	msg string
	err error
}

func (s *scrubbedError) Error() string { return s.msg }
func (s *scrubbedError) Unwrap() error { return s.err }

// keyForms returns the forms of key to look for, longest first (so that at
// one position the longest form wins, leaving no escaped tail behind).
func keyForms(key string) []string {
	seen := map[string]bool{}
	var forms []string
	add := func(f string) {
		if f != "" && !seen[f] {
			seen[f] = true
			forms = append(forms, f)
		}
	}
	for _, e1 := range escapes {
		once := e1(key)
		for _, e2 := range escapes {
			add(e2(once))
		}
	}
	if h := hex.EncodeToString([]byte(key)); len(h) >= scrubAlone {
		add(h)
		add(strings.ToUpper(h))
	}
	sort.SliceStable(forms, func(i, j int) bool { return len(forms[i]) > len(forms[j]) })
	return forms
}

// escapes are the ways text escapes a string; the first is the identity.
var escapes = []func(string) string{
	func(s string) string { return s },
	func(s string) string { q := strconv.Quote(s); return q[1 : len(q)-1] },
	func(s string) string { q := strconv.QuoteToASCII(s); return q[1 : len(q)-1] },
	func(s string) string { return jsonEscape(s, true) },
	func(s string) string { return jsonEscape(s, false) },
	func(s string) string { return strings.ReplaceAll(s, "'", "''") },
	mysqlEscape,
	url.QueryEscape,
	url.PathEscape,
}

func jsonEscape(s string, html bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(html)
	if err := enc.Encode(s); err != nil {
		return s // a string always encodes
	}
	out := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	return string(out[1 : len(out)-1])
}

// mysqlEscape escapes s as MySQL's string literals (and
// mysql_real_escape_string) do.
var mysqlEscape = strings.NewReplacer(
	`\`, `\\`, `'`, `\'`, `"`, `\"`, "\x00", `\0`, "\n", `\n`, "\r", `\r`, "\x1a", `\Z`,
).Replace

func anyForm(s string, forms []string) bool {
	for _, f := range forms {
		if strings.Contains(s, f[:min(len(f), scrubPrefix)]) {
			return true
		}
	}
	return false
}

// matchAt returns the length of the form of the key at s[i:], 0 if none.
func matchAt(s string, i int, forms []string) int {
	for _, f := range forms {
		if !strings.HasPrefix(s[i:], f) {
			continue
		}
		if len(f) < scrubAlone {
			end := i + len(f)
			if isWordByte(f[0]) && i > 0 && isWordByte(s[i-1]) {
				continue
			}
			if isWordByte(f[len(f)-1]) && end < len(s) && isWordByte(s[end]) {
				continue
			}
		}
		return len(f)
	}
	for _, f := range forms { // the key cut short
		if n := commonPrefix(s[i:], f); n >= scrubPrefix {
			return n
		}
	}
	return 0
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func isWordByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// Key is how idem shows a key wherever it must not appear in clear: a
// short hash, enough to correlate, useless to replay a request.
func Key(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:6])
}
