package nethttpidem_test

// Fault and bad-input tests: real HTTP through httptest, nethttpidem and
// memstore. Every case checks the status the client sees, what the store
// kept, and how many times the handler ran.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// faultEnv is one server: handler behind nethttpidem on a memstore, with a
// per-key count of handler runs.
type faultEnv struct {
	t      *testing.T
	srv    *httptest.Server
	store  *memstore.Store
	eng    *core.Engine
	client *http.Client

	mu   sync.Mutex
	runs map[string]int
}

func newFaultEnv(t *testing.T, h http.HandlerFunc, store *memstore.Store, opts ...core.Option) *faultEnv {
	t.Helper()
	if store == nil {
		store = memstore.New()
	}
	eng, err := core.New(store, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	env := &faultEnv{t: t, store: store, eng: eng, runs: map[string]int{}}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := core.KeyFromContext(r.Context())
		env.mu.Lock()
		env.runs[key]++
		env.mu.Unlock()
		h(w, r)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /p", mw(eng)(counted))
	env.srv = httptest.NewServer(mux)
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	env.client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	t.Cleanup(func() {
		env.srv.Close()
		tr.CloseIdleConnections()
	})
	return env
}

func (e *faultEnv) runsOf(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[key]
}

func (e *faultEnv) totalRuns() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, v := range e.runs {
		n += v
	}
	return n
}

type faultResp struct {
	status int
	header http.Header
	body   []byte
}

func (r faultResp) replayed() bool { return r.header.Get(core.ReplayedHeader) == "true" }

func (r faultResp) problemType() string {
	var p problem.Details
	if err := json.Unmarshal(r.body, &p); err != nil {
		return ""
	}
	return strings.TrimPrefix(p.Type, problem.BaseURI)
}

// post sends POST /p with the given key header lines (nil: no header).
func (e *faultEnv) post(keys []string, body io.Reader, extra http.Header) faultResp {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/p", body)
	if err != nil {
		e.t.Fatalf("new request: %v", err)
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	if keys != nil {
		req.Header["Idempotency-Key"] = keys
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("read body: %v", err)
	}
	return faultResp{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *faultEnv) postKey(key, body string) faultResp {
	e.t.Helper()
	return e.post([]string{key}, strings.NewReader(body), nil)
}

// raw sends bytes as they are on a fresh connection and reads one response.
func (e *faultEnv) raw(request string) faultResp {
	e.t.Helper()
	conn, err := net.DialTimeout("tcp", e.srv.Listener.Addr().String(), 5*time.Second)
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		e.t.Fatalf("write raw request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		e.t.Fatalf("read raw response: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return faultResp{status: resp.StatusCode, header: resp.Header, body: b}
}

func rawPost(keyLines []string, body string) string {
	var b strings.Builder
	b.WriteString("POST /p HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n")
	for _, k := range keyLines {
		b.WriteString("Idempotency-Key: " + k + "\r\n")
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	return b.String()
}

func created(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"echo_len":%d}`, len(body))
}

func TestFaultKeysOverHTTP(t *testing.T) {
	env := newFaultEnv(t, created, nil)
	k255 := strings.Repeat("k", 255)
	// 255 bytes after decoding, 512 on the wire: the longest quoted form.
	esc255 := `"` + strings.Repeat(`\\`, 255) + `"`
	cases := []struct {
		name    string
		lines   []string // raw header values, sent as they are
		status  int
		problem string // for 400s that reach idem
		key     string // the decoded key for accepted cases
	}{
		{"0 bytes", []string{""}, 400, "invalid-key", ""},
		{"only spaces", []string{"   "}, 400, "invalid-key", ""},
		{"255 bytes", []string{k255}, 201, "", k255},
		{"256 bytes", []string{k255 + "k"}, 400, "invalid-key", ""},
		{"64 KiB", []string{strings.Repeat("x", 64<<10)}, 400, "invalid-key", ""},
		{"255 escaped bytes quoted", []string{esc255}, 201, "", strings.Repeat(`\`, 255)},
		{"256 escaped bytes quoted", []string{`"` + strings.Repeat(`\\`, 256) + `"`}, 400, "invalid-key", ""},
		{"non-ASCII UTF-8 unquoted", []string{"clé-ключ-鍵"}, 400, "invalid-key", ""},
		{"non-ASCII UTF-8 quoted", []string{`"clé"`}, 400, "invalid-key", ""},
		{"latin-1 byte", []string{"caf\xe9"}, 400, "invalid-key", ""},
		{"tab inside", []string{"a\tb"}, 400, "invalid-key", ""},
		{"tab inside quoted", []string{"\"a\tb\""}, 400, "invalid-key", ""},
		{"space inside unquoted", []string{"a b"}, 400, "invalid-key", ""},
		{"space inside quoted", []string{`"a b"`}, 201, "", "a b"},
		{"quoted", []string{`"q-1"`}, 201, "", "q-1"},
		{"escaped quote", []string{`"a\"b"`}, 201, "", `a"b`},
		{"escaped backslash", []string{`"a\\b"`}, 201, "", `a\b`},
		{"invalid escape", []string{`"a\nb"`}, 400, "invalid-key", ""},
		{"unterminated", []string{`"abc`}, 400, "invalid-key", ""},
		{"empty quoted", []string{`""`}, 400, "invalid-key", ""},
		{"sf parameters", []string{`"abc";v=1`}, 400, "invalid-key", ""},
		{"list on one line", []string{`a, b`}, 400, "invalid-key", ""},
		{"quoted list", []string{`"a", "b"`}, 400, "invalid-key", ""},
		{"unquoted with quote", []string{`a"b`}, 400, "invalid-key", ""},
		{"unquoted with backslash", []string{`a\b`}, 400, "invalid-key", ""},
		{"several lines", []string{"a", "b"}, 400, "invalid-key", ""},
		{"several identical lines", []string{"same", "same"}, 400, "invalid-key", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := env.totalRuns()
			lenBefore := env.store.Len()
			r := env.raw(rawPost(tc.lines, `{"a":1}`))
			if r.status != tc.status {
				t.Fatalf("status %d, want %d; body %s", r.status, tc.status, r.body)
			}
			if tc.status != 201 {
				if got := env.totalRuns() - before; got != 0 {
					t.Errorf("handler ran %d times for a refused key", got)
				}
				if env.store.Len() != lenBefore {
					t.Errorf("store grew from %d to %d for a refused key", lenBefore, env.store.Len())
				}
				if tc.problem != "" && r.problemType() != tc.problem {
					t.Errorf("problem %q, want %q (body %s)", r.problemType(), tc.problem, r.body)
				}
				if ct := r.header.Get("Content-Type"); tc.problem != "" && ct != "application/problem+json" {
					t.Errorf("Content-Type %q", ct)
				}
				for _, l := range tc.lines {
					if len(l) > 3 && bytes.Contains(r.body, []byte(l)) {
						t.Errorf("problem body echoes the key: %s", r.body)
					}
				}
				return
			}
			if env.runsOf(tc.key) != 1 {
				t.Fatalf("handler ran %d times under decoded key %q, want 1", env.runsOf(tc.key), tc.key)
			}
			// The same header again replays; the key is stored decoded.
			again := env.raw(rawPost(tc.lines, `{"a":1}`))
			if again.status != 201 || !again.replayed() || !bytes.Equal(again.body, r.body) {
				t.Errorf("retry: status %d replayed %v body %s", again.status, again.replayed(), again.body)
			}
			if env.runsOf(tc.key) != 1 {
				t.Errorf("handler re-ran on retry: %d runs", env.runsOf(tc.key))
			}
			if _, err := env.store.Get(context.Background(), "", tc.key); err != nil {
				t.Errorf("record for decoded key %q: %v", tc.key, err)
			}
		})
	}

	// Quoted and unquoted spellings of one key are the same key.
	first := env.raw(rawPost([]string{"same-key-42"}, `{}`))
	second := env.raw(rawPost([]string{`"same-key-42"`}, `{}`))
	if first.status != 201 || second.status != 201 || !second.replayed() {
		t.Errorf("token then sf-string of the same key: %d then %d (replayed %v)", first.status, second.status, second.replayed())
	}

	// Control characters: net/http refuses them before any handler runs,
	// and the engine refuses them too (core/badinput_test.go). Either way:
	// 400 and nothing runs.
	for _, v := range []string{"a\x01b", "a\x7fb", "\"a\x00b\"", "a\x1bb"} {
		before := env.totalRuns()
		r := env.raw(rawPost([]string{v}, `{}`))
		if r.status != 400 {
			t.Errorf("key %q: status %d, want 400", v, r.status)
		}
		if env.totalRuns() != before {
			t.Errorf("key %q: handler ran", v)
		}
	}

	// Missing header entirely: 400 missing-key.
	if r := env.raw(rawPost(nil, `{}`)); r.status != 400 || r.problemType() != "missing-key" {
		t.Errorf("no key: %d %s", r.status, r.body)
	}
}

func TestFaultHugeHeaderCounts(t *testing.T) {
	env := newFaultEnv(t, created, nil)
	// 10,000 unrelated header lines: served normally.
	extra := http.Header{}
	for i := range 10000 {
		extra.Set("X-H-"+strconv.Itoa(i), "v")
	}
	if r := env.post([]string{"many-headers"}, strings.NewReader("{}"), extra); r.status != 201 {
		t.Fatalf("10k headers: status %d %s", r.status, r.body)
	}
	// 10,000 Idempotency-Key lines: several lines, refused.
	lines := make([]string, 10000)
	for i := range lines {
		lines[i] = "k" + strconv.Itoa(i)
	}
	before := env.totalRuns()
	if r := env.post(lines, strings.NewReader("{}"), nil); r.status != 400 || r.problemType() != "invalid-key" {
		t.Fatalf("10k key lines: status %d %s", r.status, r.body)
	}
	if env.totalRuns() != before {
		t.Errorf("handler ran for 10k key lines")
	}
	// A header block past net/http's limit never reaches idem.
	huge := http.Header{}
	for i := range 40000 {
		huge.Set("X-Big-"+strconv.Itoa(i), strings.Repeat("v", 32))
	}
	req, _ := http.NewRequest(http.MethodPost, env.srv.URL+"/p", strings.NewReader("{}"))
	req.Header = huge
	req.Header.Set("Idempotency-Key", "too-many")
	// net/http answers 431 and closes; the client may see the answer or a
	// broken pipe, depending on how far it got writing.
	if resp, err := env.client.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("oversized header block: status %d", resp.StatusCode)
		}
	}
	if env.runsOf("too-many") != 0 {
		t.Errorf("handler ran for an oversized header block")
	}
}

// chunked hides the length of its body so the client sends it chunked.
type chunked struct{ r io.Reader }

func (c chunked) Read(p []byte) (int, error) { return c.r.Read(p) }

func TestFaultRequestBodyLimit(t *testing.T) {
	const limit = 1024
	env := newFaultEnv(t, created, nil, core.WithMaxRequestBytes(limit))
	at := strings.Repeat("a", limit)
	over := at + "a"

	r := env.postKey("over", over)
	if r.status != 413 || r.problemType() != "body-too-large" {
		t.Fatalf("over the limit: %d %s", r.status, r.body)
	}
	r = env.post([]string{"over-chunked"}, chunked{strings.NewReader(strings.Repeat("b", 4<<20))}, nil)
	if r.status != 413 {
		t.Fatalf("4 MiB chunked: %d %s", r.status, r.body)
	}
	if env.totalRuns() != 0 || env.store.Len() != 0 {
		t.Fatalf("a refused body ran the handler (%d) or stored a record (%d)", env.totalRuns(), env.store.Len())
	}
	// The key was not burned: the same key with a body at the limit runs.
	r = env.postKey("over", at)
	if r.status != 201 || string(r.body) != `{"echo_len":1024}` {
		t.Fatalf("at the limit: %d %s", r.status, r.body)
	}
	r = env.post([]string{"at-chunked"}, chunked{strings.NewReader(at)}, nil)
	if r.status != 201 {
		t.Fatalf("at the limit, chunked: %d %s", r.status, r.body)
	}
	// Same key, now over the limit: 413 before anything else, the stored
	// 201 untouched and still replayed.
	if r := env.postKey("over", over); r.status != 413 {
		t.Errorf("over the limit on a used key: %d", r.status)
	}
	if r := env.postKey("over", at); r.status != 201 || !r.replayed() {
		t.Errorf("replay after a 413: %d replayed %v", r.status, r.replayed())
	}
	if env.runsOf("over") != 1 {
		t.Errorf("handler ran %d times for key over", env.runsOf("over"))
	}
}

// strictJSON answers 400 for a body that is not JSON, 201 otherwise.
func strictJSON(w http.ResponseWriter, r *http.Request) {
	var v map[string]any
	if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"invalid JSON"}`)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	b, _ := json.Marshal(v)
	w.Write(b)
}

func TestFaultCanonicalJSONBadBodies(t *testing.T) {
	env := newFaultEnv(t, strictJSON, nil, core.WithCanonicalJSON(true))

	// Invalid JSON: the handler still answers; its 400 is final, stored,
	// and replayed.
	r := env.postKey("bad-json", `{"amount":`)
	if r.status != 400 || r.replayed() {
		t.Fatalf("invalid JSON: %d replayed %v %s", r.status, r.replayed(), r.body)
	}
	r2 := env.postKey("bad-json", `{"amount":`)
	if r2.status != 400 || !r2.replayed() || !bytes.Equal(r.body, r2.body) {
		t.Fatalf("invalid JSON retry: %d replayed %v %s", r2.status, r2.replayed(), r2.body)
	}
	// Other invalid bytes under the same key are another request.
	if r := env.postKey("bad-json", `{"amount": `); r.status != 422 {
		t.Errorf("other invalid JSON, same key: %d", r.status)
	}
	if r := env.postKey("bad-json", `{"amount":1}`); r.status != 422 {
		t.Errorf("valid JSON after invalid, same key: %d", r.status)
	}
	if env.runsOf("bad-json") != 1 {
		t.Errorf("handler ran %d times", env.runsOf("bad-json"))
	}

	// Re-encoded valid JSON matches.
	if r := env.postKey("reenc", `{"amount":1,"to":"a"}`); r.status != 201 {
		t.Fatalf("valid JSON: %d", r.status)
	}
	if r := env.postKey("reenc", "{ \"to\" : \"a\",\n \"amount\" : 1 }"); r.status != 201 || !r.replayed() {
		t.Errorf("re-encoded JSON: %d replayed %v", r.status, r.replayed())
	}

	// Bodies encoding/json would decode to the same value but that are
	// different requests must never replay each other's response.
	pairs := []struct{ name, first, second string }{
		{"invalid UTF-8 bytes", "{\"to\":\"\xff\"}", "{\"to\":\"\xfe\"}"},
		{"invalid UTF-8 vs U+FFFD", "{\"to\":\"\xff\"}", `{"to":"` + "\uFFFD" + `"}`},
		{"lone surrogates", `{"to":"\ud800"}`, `{"to":"\udc00"}`},
		{"duplicate keys", `{"amount":1,"amount":50000}`, `{"amount":50000}`},
		{"duplicate keys reversed", `{"amount":50000,"amount":1}`, `{"amount":1}`},
		{"1 vs 1.0", `{"amount":1}`, `{"amount":1.0}`},
	}
	for i, p := range pairs {
		key := "pair-" + strconv.Itoa(i)
		a := env.postKey(key, p.first)
		if a.status == 422 || a.replayed() {
			t.Errorf("%s: first request %d replayed %v", p.name, a.status, a.replayed())
			continue
		}
		b := env.postKey(key, p.second)
		if b.status != 422 {
			t.Errorf("%s: second request under the same key got %d (replayed %v, %s), want 422", p.name, b.status, b.replayed(), b.body)
		}
		// Each is still its own request: the first replays.
		if c := env.postKey(key, p.first); !c.replayed() || !bytes.Equal(c.body, a.body) {
			t.Errorf("%s: first request's retry: %d replayed %v", p.name, c.status, c.replayed())
		}
		if env.runsOf(key) != 1 {
			t.Errorf("%s: handler ran %d times", p.name, env.runsOf(key))
		}
	}

	// Invalid UTF-8 without canonical JSON: raw bytes, replayed byte for byte.
	raw := newFaultEnv(t, created, nil)
	body := "\xff\xfe\x00garbage\x80"
	x := raw.postKey("raw-utf8", body)
	y := raw.postKey("raw-utf8", body)
	if x.status != 201 || !y.replayed() || raw.postKey("raw-utf8", "\xff\xfe\x00garbage\x81").status != 422 {
		t.Errorf("invalid UTF-8 raw body: %d, retry replayed %v", x.status, y.replayed())
	}
}

func TestFaultHandlerBehaviours(t *testing.T) {
	t.Run("panics", func(t *testing.T) {
		env := newFaultEnv(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Set-Cookie", "session=leak")
			w.Header().Set("X-Half-Done", "1")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"partial":true}`)
			panic("boom")
		}, nil)
		r := env.postKey("p", "{}")
		if r.status != 500 || r.problemType() != problem.HandlerPanic {
			t.Fatalf("panic: %d %s", r.status, r.body)
		}
		if r.header.Get("Set-Cookie") != "" || r.header.Get("X-Half-Done") != "" || bytes.Contains(r.body, []byte("partial")) {
			t.Errorf("the panicking handler's half response leaked: %v %s", r.header, r.body)
		}
		rec, err := env.store.Get(context.Background(), "", "p")
		if err != nil || rec.Status != storekit.StatusFailed || rec.Response != nil {
			t.Fatalf("record after panic: %+v %v (want failed, no response)", rec, err)
		}
		// Failed, not completed: the retry runs again, and is not a replay.
		r = env.postKey("p", "{}")
		if r.status != 500 || r.replayed() || env.runsOf("p") != 2 {
			t.Errorf("retry after panic: %d replayed %v runs %d", r.status, r.replayed(), env.runsOf("p"))
		}
	})

	t.Run("panics with ErrAbortHandler", func(t *testing.T) {
		env := newFaultEnv(t, func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }, nil)
		req, _ := http.NewRequest(http.MethodPost, env.srv.URL+"/p", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "abort")
		resp, err := env.client.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("ErrAbortHandler answered %d; want a dropped connection", resp.StatusCode)
		}
		rec, err := env.store.Get(context.Background(), "", "abort")
		if err != nil || rec.Status != storekit.StatusFailed {
			t.Errorf("record: %+v %v", rec, err)
		}
	})

	t.Run("writes twice", func(t *testing.T) {
		env := newFaultEnv(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			w.WriteHeader(http.StatusInternalServerError) // ignored
			io.WriteString(w, "one")
			w.WriteHeader(http.StatusBadGateway) // ignored
			io.WriteString(w, "two")
		}, nil)
		a := env.postKey("w2", "{}")
		b := env.postKey("w2", "{}")
		if a.status != 201 || string(a.body) != "onetwo" {
			t.Fatalf("first: %d %q", a.status, a.body)
		}
		if b.status != 201 || !b.replayed() || string(b.body) != "onetwo" || env.runsOf("w2") != 1 {
			t.Errorf("retry: %d replayed %v %q runs %d", b.status, b.replayed(), b.body, env.runsOf("w2"))
		}
	})

	t.Run("writes body then header", func(t *testing.T) {
		env := newFaultEnv(t, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "implicit 200")
			w.WriteHeader(http.StatusInternalServerError) // too late: ignored
		}, nil)
		a := env.postKey("bh", "{}")
		b := env.postKey("bh", "{}")
		if a.status != 200 || b.status != 200 || !b.replayed() || env.runsOf("bh") != 1 {
			t.Errorf("got %d then %d (replayed %v), runs %d", a.status, b.status, b.replayed(), env.runsOf("bh"))
		}
	})

	t.Run("flushes", func(t *testing.T) {
		env := newFaultEnv(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "part;")
			http.NewResponseController(w).Flush()
			io.WriteString(w, "rest")
		}, nil)
		a := env.postKey("fl", `{"a":1}`)
		if a.status != 201 || string(a.body) != "part;rest" {
			t.Fatalf("streamed response: %d %q", a.status, a.body)
		}
		for range 3 {
			b := env.postKey("fl", `{"a":1}`)
			if b.status != 409 || b.problemType() != problem.NotRetained || b.replayed() {
				t.Fatalf("retry of a streamed response: %d %s", b.status, b.body)
			}
		}
		if m := env.postKey("fl", `{"a":2}`); m.status != 422 {
			t.Errorf("other body under a not-retained key: %d", m.status)
		}
		if env.runsOf("fl") != 1 {
			t.Errorf("a streamed response's handler ran %d times", env.runsOf("fl"))
		}
		rec, err := env.store.Get(context.Background(), "", "fl")
		if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || !rec.Response.NotRetained || len(rec.Response.Body) != 0 {
			t.Errorf("record: %+v %v", rec, err)
		}
	})

	t.Run("hijacks", func(t *testing.T) {
		end, ended := commits()
		env := newFaultEnv(t, func(w http.ResponseWriter, r *http.Request) {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if !assert.NoError(t, err, "hijack") {
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			brw.Flush()
		}, nil, end)
		a := env.raw(rawPost([]string{"hj"}, "{}"))
		require.Equal(t, 201, a.status, "hijacked: %q", a.body)
		require.Equal(t, "ok", string(a.body), "hijacked")
		// The hijacked bytes reach the client before Commit runs: retry
		// once the commit is recorded.
		require.Equal(t, core.EventCommit, nextCommit(t, ended))
		b := env.postKey("hj", "{}")
		assert.Equal(t, 409, b.status, "retry of a hijacked response: %s", b.body)
		assert.Equal(t, problem.NotRetained, b.problemType(), "retry of a hijacked response: %s", b.body)
		assert.Equal(t, 1, env.runsOf("hj"), "handler runs")
	})

	t.Run("never writes", func(t *testing.T) {
		env := newFaultEnv(t, func(http.ResponseWriter, *http.Request) {}, nil)
		a := env.postKey("nw", "{}")
		if a.status != 200 || len(a.body) != 0 || a.replayed() {
			t.Fatalf("silent handler: %d %q", a.status, a.body)
		}
		b := env.postKey("nw", "{}")
		if b.status != 200 || len(b.body) != 0 || !b.replayed() || env.runsOf("nw") != 1 {
			t.Errorf("retry: %d %q replayed %v runs %d", b.status, b.body, b.replayed(), env.runsOf("nw"))
		}
		rec, err := env.store.Get(context.Background(), "", "nw")
		if err != nil || rec.Status != storekit.StatusCompleted || rec.Response == nil || rec.Response.Status != 200 || rec.Response.NotRetained {
			t.Errorf("record: %+v %v", rec, err)
		}
	})

	t.Run("5xx is not stored", func(t *testing.T) {
		var n atomic.Int32
		env := newFaultEnv(t, func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) == 1 {
				http.Error(w, "provider down", http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}, nil)
		if r := env.postKey("5xx", "{}"); r.status != 502 {
			t.Fatalf("first: %d", r.status)
		}
		if r := env.postKey("5xx", "{}"); r.status != 201 || r.replayed() {
			t.Fatalf("retry after 502: %d replayed %v", r.status, r.replayed())
		}
		if r := env.postKey("5xx", "{}"); r.status != 201 || !r.replayed() || env.runsOf("5xx") != 2 {
			t.Errorf("third: %d replayed %v runs %d", r.status, r.replayed(), env.runsOf("5xx"))
		}
	})
}

// TestFaultLargeResponseNotBufferedWhole checks that a response past
// WithMaxResponseBytes goes out whole while the recorder keeps at most the
// limit in memory, and that its key then refuses to run again.
func TestFaultLargeResponseNotBufferedWhole(t *testing.T) {
	const limit = 4096
	const total = 8 << 20
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 2048) // 32 KiB
	var maxBuffered atomic.Int64
	env := newFaultEnv(t, func(w http.ResponseWriter, r *http.Request) {
		rec, ok := w.(*adapterkit.Recorder)
		if !ok {
			t.Errorf("handler writer is %T, not *adapterkit.Recorder", w)
			return
		}
		switch r.Header.Get("X-Size") {
		case "at":
			w.Write(bytes.Repeat([]byte("x"), limit))
		case "over":
			w.Write(bytes.Repeat([]byte("x"), limit+1))
		default:
			for written := 0; written < total; written += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				if s := int64(rec.Size()); s > maxBuffered.Load() {
					maxBuffered.Store(s)
				}
			}
		}
	}, nil, core.WithMaxResponseBytes(limit))

	r := env.postKey("big", "{}")
	want := sha256.Sum256(bytes.Repeat(chunk, total/len(chunk)))
	if r.status != 200 || len(r.body) != total || sha256.Sum256(r.body) != want {
		t.Fatalf("large response: status %d, %d bytes (want %d, intact)", r.status, len(r.body), total)
	}
	if m := maxBuffered.Load(); m > limit {
		t.Errorf("recorder buffered %d bytes, limit %d", m, limit)
	}
	if r := env.postKey("big", "{}"); r.status != 409 || r.problemType() != problem.NotRetained || env.runsOf("big") != 1 {
		t.Errorf("retry: %d %s runs %d", r.status, r.body, env.runsOf("big"))
	}

	at := http.Header{"X-Size": {"at"}}
	a1 := env.post([]string{"at"}, strings.NewReader("{}"), at)
	a2 := env.post([]string{"at"}, strings.NewReader("{}"), at)
	if len(a1.body) != limit || !a2.replayed() || !bytes.Equal(a1.body, a2.body) {
		t.Errorf("response at the limit: %d bytes, retry replayed %v", len(a1.body), a2.replayed())
	}
	over := http.Header{"X-Size": {"over"}}
	o1 := env.post([]string{"over"}, strings.NewReader("{}"), over)
	o2 := env.post([]string{"over"}, strings.NewReader("{}"), over)
	if len(o1.body) != limit+1 || o2.status != 409 || o2.problemType() != problem.NotRetained {
		t.Errorf("response one byte over the limit: %d bytes, retry %d %s", len(o1.body), o2.status, o2.body)
	}
}

// TestFaultMemstoreFloodBounded floods a bounded memstore with distinct
// keys: the store never holds more than its maximum, live records are
// never evicted (they still replay), the overflow is refused with 503
// without running the handler, and expired records make room again.
func TestFaultMemstoreFloodBounded(t *testing.T) {
	const maxEntries, flood = 100, 1000
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := memstore.New(memstore.WithMaxEntries(maxEntries), memstore.WithClock(clock))
	env := newFaultEnv(t, created, store, core.WithRetention(time.Hour))

	var ok, full, other atomic.Int64
	var wg sync.WaitGroup
	keys := make(chan string)
	for range 8 {
		wg.Go(func() {
			for k := range keys {
				req, _ := http.NewRequest(http.MethodPost, env.srv.URL+"/p", strings.NewReader("{}"))
				req.Header.Set("Idempotency-Key", k)
				resp, err := env.client.Do(req)
				if err != nil {
					t.Errorf("POST %s: %v", k, err)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == 201:
					ok.Add(1)
				case resp.StatusCode == 503 && bytes.Contains(b, []byte(problem.StoreUnavailable)):
					full.Add(1)
				default:
					other.Add(1)
				}
				if n := store.Len(); n > maxEntries {
					t.Errorf("store holds %d records, max %d", n, maxEntries)
				}
			}
		})
	}
	for i := range flood {
		keys <- "flood-" + strconv.Itoa(i)
	}
	close(keys)
	wg.Wait()
	if ok.Load() != maxEntries || full.Load() != flood-maxEntries || other.Load() != 0 {
		t.Fatalf("flood: %d created, %d refused full, %d other; want %d, %d, 0", ok.Load(), full.Load(), other.Load(), maxEntries, flood-maxEntries)
	}
	if env.totalRuns() != maxEntries {
		t.Errorf("handler ran %d times, want %d", env.totalRuns(), maxEntries)
	}
	// Every accepted key still replays: nothing live was evicted.
	replays := 0
	for i := range flood {
		k := "flood-" + strconv.Itoa(i)
		if env.runsOf(k) == 1 {
			if r := env.postKey(k, "{}"); r.status == 201 && r.replayed() {
				replays++
			}
		}
	}
	if replays != maxEntries {
		t.Errorf("%d of %d accepted keys replay", replays, maxEntries)
	}
	// Past retention the store makes room again.
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	if r := env.postKey("after-expiry", "{}"); r.status != 201 {
		t.Errorf("after retention: %d %s", r.status, r.body)
	}
	if store.Len() > maxEntries {
		t.Errorf("store holds %d records after expiry, max %d", store.Len(), maxEntries)
	}
	t.Logf("flood: %d created, %d refused (503), %d replayed; store size %d", ok.Load(), full.Load(), replays, store.Len())
}

// TestFaultMemstoreHeapBounded drives the engine directly with 20,000
// distinct keys and 1 KiB responses: with a bound of 500 entries the heap
// stays far below what 20,000 stored responses would take.
func TestFaultMemstoreHeapBounded(t *testing.T) {
	const maxEntries, n = 500, 20000
	store := memstore.New(memstore.WithMaxEntries(maxEntries))
	eng, err := core.New(store, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("r"), 1024)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	ctx := context.Background()
	refused := 0
	for i := range n {
		d, err := eng.Decide(ctx, core.Request{
			Method: "POST", Route: "/p",
			Header: http.Header{"Idempotency-Key": {"heap-" + strconv.Itoa(i)}},
			Body:   bytes.NewReader(body),
		})
		if err != nil {
			if !errors.Is(err, memstore.ErrFull) || d.Outcome != core.Reject || d.Response.Status != 503 {
				t.Fatalf("key %d: %v, %v", i, err, d.Outcome)
			}
			refused++
			continue
		}
		if d.Outcome != core.Proceed {
			t.Fatalf("key %d: outcome %v", i, d.Outcome)
		}
		if err := eng.Commit(ctx, d, adapterkit.Response{Status: 201, Body: append([]byte(nil), body...)}); err != nil {
			t.Fatal(err)
		}
	}
	after := heap()
	grew := int64(after) - int64(before)
	t.Logf("heap grew %d KiB for %d keys (%d refused), store size %d", grew>>10, n, refused, store.Len())
	if store.Len() != maxEntries || refused != n-maxEntries {
		t.Errorf("store size %d, refused %d", store.Len(), refused)
	}
	// 20,000 kept responses would be > 20 MiB; 500 are < 1 MiB.
	if grew > 8<<20 {
		t.Errorf("heap grew %d MiB under a bounded store", grew>>20)
	}
}
