package idemtest

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/core"
)

// Sentinel is an idempotency key that must never appear in what idem
// writes or hands on.
type Sentinel struct {
	Name string
	Key  string
	// Valid: ParseKey accepts it (sent, it is claimed); an invalid one is
	// refused with 400 and must not appear either.
	Valid bool
}

// SentinelKeys are the keys the sentinel checks drive down every path: the
// shortest (1 byte), a short one with a quote and a backslash, the longest
// (255 bytes) with every character that escapes differently in Go, JSON,
// SQL and URLs, an ordinary UUID-like key, and a non-ASCII one (refused by
// the key grammar: printable ASCII only).
func SentinelKeys() []Sentinel {
	long := `SENTINEL "dq" \bs\ 'sq' <b>&amp; %41+x=y;z ` + "`bt`" + ` `
	for len(long) < core.MaxKeyBytes {
		long += "Zq9"
	}
	long = long[:core.MaxKeyBytes-1] + "Z"
	return []Sentinel{
		{"1_byte", "Q", true},
		{"short_quote_backslash", `Z"\'<&9`, true},
		{"255_bytes", long, true},
		{"uuid_like", "SENTINEL-7f3a9c1e-idem-key-must-never-leak", true},
		{"non_ascii", "SENTINEL-ключ-ü", false},
	}
}

// HeaderValue is how a client sends key: as a token when it can be one,
// otherwise as an RFC 8941 string.
func HeaderValue(key string) string {
	if !strings.ContainsAny(key, "\"\\, ") {
		return key
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// KeyLeaks returns the places in text where key appears, in any form text
// carries a key in: verbatim; escaped as Go (%q, strconv.Quote,
// QuoteToASCII), as JSON (with and without HTML escaping), as SQL literals
// (doubled quotes; MySQL backslashes), as URLs (query, path), each escape
// applied once or twice; and hex. A form shorter than 8 bytes counts only
// where it stands alone (not inside a longer run of letters and digits:
// "a" in "abort" is not the key "a"); hex forms shorter than 8 digits are
// numbers, not keys, and are not searched. The first 16 bytes of a longer
// form count too: text cut short inside the key (a database truncating its
// message) still shows it. nil when the key is nowhere.
func KeyLeaks(text, key string) []string {
	if key == "" {
		return nil
	}
	var out []string
	for _, f := range leakForms(key) {
		var locs [][]int
		if len(f) >= 8 {
			f := f[:min(len(f), 16)] // a form cut short still leaks
			for i := 0; ; {
				j := strings.Index(text[i:], f)
				if j < 0 {
					break
				}
				locs = append(locs, []int{i + j, i + j + len(f)})
				i += j + 1
			}
		} else {
			pre, post := "", ""
			if isAlnum(f[0]) {
				pre = `(?:^|[^0-9A-Za-z])`
			}
			if isAlnum(f[len(f)-1]) {
				post = `(?:$|[^0-9A-Za-z])`
			}
			re := regexp.MustCompile(pre + `(` + regexp.QuoteMeta(f) + `)` + post)
			for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
				locs = append(locs, m[2:4])
			}
		}
		for _, l := range locs {
			from, to := max(l[0]-60, 0), min(l[1]+60, len(text))
			out = append(out, fmt.Sprintf("form %q at %d: …%s…", f, l[0], text[from:to]))
		}
	}
	return out
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func leakForms(key string) []string {
	inner := func(q string) string { return q[1 : len(q)-1] }
	js := func(s string, html bool) string {
		var b bytes.Buffer
		e := json.NewEncoder(&b)
		e.SetEscapeHTML(html)
		_ = e.Encode(s)
		return inner(strings.TrimSpace(b.String()))
	}
	escs := []func(string) string{
		func(s string) string { return s },
		func(s string) string { return inner(strconv.Quote(s)) },
		func(s string) string { return inner(strconv.QuoteToASCII(s)) },
		func(s string) string { return inner(fmt.Sprintf("%+q", s)) },
		func(s string) string { return js(s, true) },
		func(s string) string { return js(s, false) },
		func(s string) string { return strings.ReplaceAll(s, "'", "''") },
		func(s string) string {
			return strings.NewReplacer(`\`, `\\`, `'`, `\'`, `"`, `\"`).Replace(s)
		},
		url.QueryEscape,
		url.PathEscape,
	}
	seen := map[string]bool{}
	var forms []string
	for _, a := range escs {
		for _, b := range escs {
			if f := b(a(key)); !seen[f] {
				seen[f] = true
				forms = append(forms, f)
			}
		}
	}
	if h := hex.EncodeToString([]byte(key)); len(h) >= 8 {
		forms = append(forms, h, strings.ToUpper(h))
	}
	return forms
}

// Capture collects what idem writes or hands on, to search it for keys:
// the engine's log (Options), the observer's event errors, any error
// given to Err, and any other text (framework logs, response bodies)
// written to a Writer.
type Capture struct {
	log  LogBuffer
	mu   sync.Mutex
	errs []string
	bufs []*LogBuffer
}

// Options log everything the engine says (debug level, text handler) and
// observe every event, into c.
func (c *Capture) Options() []core.Option {
	return []core.Option{
		core.WithLogger(slog.New(slog.NewTextHandler(&c.log, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		core.WithObserver(func(ev core.Event) { c.Err(ev.Err) }),
	}
}

// JSONOptions are Options with slog's JSON handler (its own escaping).
func (c *Capture) JSONOptions() []core.Option {
	return []core.Option{
		core.WithLogger(slog.New(slog.NewJSONHandler(&c.log, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		core.WithObserver(func(ev core.Event) { c.Err(ev.Err) }),
	}
}

// Err records err's message in every form a logger prints it.
func (c *Capture) Err(err error) {
	if err == nil {
		return
	}
	c.Text(fmt.Sprintf("%v | %+v | %q | %#v", err, err, err.Error(), err.Error()))
}

// Text records s.
func (c *Capture) Text(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, s)
}

// Writer returns a new concurrency-safe writer whose output c includes.
func (c *Capture) Writer() *LogBuffer {
	b := new(LogBuffer)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bufs = append(c.bufs, b)
	return b
}

// String is everything captured.
func (c *Capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	b.WriteString(c.log.String())
	for _, s := range c.errs {
		b.WriteString(s)
		b.WriteByte('\n')
	}
	for _, w := range c.bufs {
		b.WriteString(w.String())
	}
	return b.String()
}

// NoKey fails t for each place the key appears in what c captured.
func (c *Capture) NoKey(t testing.TB, key string) {
	t.Helper()
	leaks := KeyLeaks(c.String(), key)
	for i, l := range leaks {
		if i == 10 {
			t.Errorf("... and %d more", len(leaks)-i)
			break
		}
		t.Errorf("the raw key leaked: %s", l)
	}
}
