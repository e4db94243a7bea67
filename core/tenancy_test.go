package core_test

// Tenancy and secrecy: one tenant never sees another's response, secrets in
// response headers are never replayed, and logs carry neither keys nor
// bodies nor fingerprints. Real HTTP through nethttpidem and memstore.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/nethttpidem"
)

type tenancyEnv struct {
	t      *testing.T
	url    string
	store  *memstore.Store
	client *http.Client

	mu   sync.Mutex
	runs map[string]int // "scope|key" -> runs
	ran  chan struct{}  // closed (and replaced) at every run
}

// newTenancyEnv serves POST /pay with the scope from X-User-ID (missing:
// 401). The handler answers with the user's private data and a set of
// headers that must never be replayed; block, when set, holds it.
func newTenancyEnv(t *testing.T, store *memstore.Store, block <-chan struct{}, opts ...core.Option) *tenancyEnv {
	t.Helper()
	if store == nil {
		store = memstore.New()
	}
	eng, err := core.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	env := &tenancyEnv{t: t, store: store, runs: map[string]int{}, ran: make(chan struct{})}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get("X-User-ID")
		key, _ := core.KeyFromContext(r.Context())
		env.mu.Lock()
		env.runs[user+"|"+key]++
		n := env.runs[user+"|"+key]
		close(env.ran)
		env.ran = make(chan struct{})
		env.mu.Unlock()
		if block != nil {
			select {
			case <-block:
			case <-r.Context().Done():
			}
		}
		body, _ := io.ReadAll(r.Body)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/pay/"+user)
		h.Set("ETag", `"`+user+`"`)
		h.Set("Set-Cookie", "session=secret-of-"+user)
		h.Set("WWW-Authenticate", `Bearer realm="`+user+`"`)
		h.Set("Authorization", "Bearer token-of-"+user)
		h.Set("Proxy-Authenticate", "Basic")
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Upgrade", "websocket")
		h.Set("Trailer", "X-Checksum")
		h.Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
		h.Set("X-Internal-Trace", "trace-of-"+user)
		h.Set("Cache-Control", "private")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"user":%q,"secret":"private-data-of-%s","run":%d,"relay":%q,"body_len":%d}`,
			user, user, n, core.RelayKey(r.Context(), "provider"), len(body))
	})
	mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-User-ID"); u != "" {
			return u, nil
		}
		return "", errors.New("no user")
	}))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /pay", mw(h))
	srv := httptest.NewServer(mux)
	tr := &http.Transport{}
	env.url = srv.URL
	env.client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return env
}

// waitRun returns once user's handler for key has started.
func (e *tenancyEnv) waitRun(user, key string) {
	e.t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		e.mu.Lock()
		n, ran := e.runs[user+"|"+key], e.ran
		e.mu.Unlock()
		if n > 0 {
			return
		}
		select {
		case <-ran:
		case <-timeout:
			e.t.Fatalf("%s's handler for %s never started", user, key)
		}
	}
}

func (e *tenancyEnv) runsOf(user, key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[user+"|"+key]
}

type tenancyResp struct {
	status int
	header http.Header
	body   []byte
}

func (e *tenancyEnv) post(user, key, body string) tenancyResp {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+"/pay", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return tenancyResp{resp.StatusCode, resp.Header, b}
}

func TestTenancyOtherUserNeverSeesResponse(t *testing.T) {
	env := newTenancyEnv(t, nil, nil)
	const key = "shared-key-1"
	a := env.post("alice", key, `{"amount":100}`)
	if a.status != 201 || !bytes.Contains(a.body, []byte("private-data-of-alice")) {
		t.Fatalf("alice: %d %s", a.status, a.body)
	}
	// Bob, same key, same body: his own execution, his own response.
	b := env.post("bob", key, `{"amount":100}`)
	if b.status != 201 || b.header.Get(core.ReplayedHeader) != "" {
		t.Fatalf("bob with alice's key: %d replayed %q", b.status, b.header.Get(core.ReplayedHeader))
	}
	if bytes.Contains(b.body, []byte("alice")) || !bytes.Contains(b.body, []byte("private-data-of-bob")) {
		t.Fatalf("bob saw %s", b.body)
	}
	// Bob, same key, other body: a mismatch against *his* record only.
	if m := env.post("bob", key, `{"amount":999}`); m.status != 422 || bytes.Contains(m.body, []byte("alice")) {
		t.Errorf("bob, other body: %d %s", m.status, m.body)
	}
	// Carol, same key, a body alice never sent: hers to run.
	if c := env.post("carol", key, `{"amount":5}`); c.status != 201 || bytes.Contains(c.body, []byte("alice")) {
		t.Errorf("carol: %d %s", c.status, c.body)
	}
	// Each replays their own.
	if r := env.post("alice", key, `{"amount":100}`); !bytes.Equal(r.body, a.body) || r.header.Get(core.ReplayedHeader) != "true" {
		t.Errorf("alice replay: %s", r.body)
	}
	if r := env.post("bob", key, `{"amount":100}`); !bytes.Equal(r.body, b.body) {
		t.Errorf("bob replay: %s", r.body)
	}
	for _, u := range []string{"alice", "bob", "carol"} {
		if n := env.runsOf(u, key); n != 1 {
			t.Errorf("%s's handler ran %d times", u, n)
		}
	}
	// Relay keys differ per tenant: a provider never merges their charges.
	var ra, rb struct{ Relay string }
	_ = json.Unmarshal(a.body, &ra)
	_ = json.Unmarshal(b.body, &rb)
	if ra.Relay == "" || ra.Relay == rb.Relay {
		t.Errorf("relay keys: alice %q bob %q", ra.Relay, rb.Relay)
	}
	// No user: 401, nothing runs, nothing stored for the empty scope.
	if r := env.post("", key, `{"amount":100}`); r.status != 401 {
		t.Errorf("no user: %d", r.status)
	}
	if _, err := env.store.Get(context.Background(), "", key); !errors.Is(err, storekit.ErrNotFound) {
		t.Errorf("record under the empty scope: %v", err)
	}
}

// TestTenancyInFlightIsPerTenant: while alice's request holds the key, bob
// with the same key is neither blocked nor told it is in flight.
func TestTenancyInFlightIsPerTenant(t *testing.T) {
	block := make(chan struct{})
	env := newTenancyEnv(t, nil, block)
	done := make(chan tenancyResp, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, env.url+"/pay", strings.NewReader("{}"))
		req.Header.Set("X-User-ID", "alice")
		req.Header.Set("Idempotency-Key", "k")
		resp, err := env.client.Do(req)
		if err != nil {
			t.Errorf("alice: %v", err)
			done <- tenancyResp{}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- tenancyResp{resp.StatusCode, resp.Header, b}
	}()
	env.waitRun("alice", "k")
	// Alice's duplicate: 409. Bob: not blocked by alice.
	if r := env.post("alice", "k", "{}"); r.status != 409 {
		t.Errorf("alice's duplicate while in flight: %d", r.status)
	}
	bobDone := make(chan tenancyResp, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, env.url+"/pay", strings.NewReader("{}"))
		req.Header.Set("X-User-ID", "bob")
		req.Header.Set("Idempotency-Key", "k")
		resp, err := env.client.Do(req)
		if err != nil {
			t.Errorf("bob: %v", err)
			bobDone <- tenancyResp{}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		bobDone <- tenancyResp{resp.StatusCode, resp.Header, b}
	}()
	env.waitRun("bob", "k")
	if env.runsOf("bob", "k") != 1 {
		t.Errorf("bob's handler did not start while alice held the same key")
	}
	close(block)
	if r := <-done; r.status != 201 || !bytes.Contains(r.body, []byte(`"user":"alice"`)) {
		t.Errorf("alice: %d %s", r.status, r.body)
	}
	if r := <-bobDone; r.status != 201 || !bytes.Contains(r.body, []byte(`"user":"bob"`)) {
		t.Errorf("bob: %d %s", r.status, r.body)
	}
}

// TestTenancyScopeKeyBoundaries: (scope, key) pairs whose concatenations
// coincide are different records with different relay keys.
func TestTenancyScopeKeyBoundaries(t *testing.T) {
	env := newTenancyEnv(t, nil, nil)
	pairs := [][2]string{{"a", "b|c"}, {"a|b", "c"}, {"ab", "c"}, {"a", "bc"}}
	relays := map[string]bool{}
	for _, p := range pairs {
		r := env.post(p[0], p[1], "{}")
		if r.status != 201 || r.header.Get(core.ReplayedHeader) != "" {
			t.Fatalf("%q/%q: %d replayed %q", p[0], p[1], r.status, r.header.Get(core.ReplayedHeader))
		}
		var v struct{ User, Relay string }
		if err := json.Unmarshal(r.body, &v); err != nil || v.User != p[0] {
			t.Fatalf("%q/%q: %s", p[0], p[1], r.body)
		}
		relays[v.Relay] = true
	}
	if len(relays) != len(pairs) {
		t.Errorf("relay keys collide across scope/key boundaries: %v", relays)
	}
	if env.store.Len() != len(pairs) {
		t.Errorf("%d records for %d pairs", env.store.Len(), len(pairs))
	}
}

var tenancyNeverReplayed = []string{
	"Set-Cookie", "Www-Authenticate", "Authorization", "Proxy-Authenticate", "Connection", "X-Hop",
	"Keep-Alive", "Upgrade", "Trailer", "X-Internal-Trace", "Cache-Control",
}

func TestTenancySecretHeadersNeverReplayed(t *testing.T) {
	env := newTenancyEnv(t, nil, nil)
	first := env.post("alice", "hdr", "{}")
	if first.status != 201 || first.header.Get("Set-Cookie") == "" {
		t.Fatalf("first response: %d %v", first.status, first.header)
	}
	rep := env.post("alice", "hdr", "{}")
	if rep.header.Get(core.ReplayedHeader) != "true" || !bytes.Equal(rep.body, first.body) {
		t.Fatalf("replay: %v %s", rep.header, rep.body)
	}
	for _, h := range tenancyNeverReplayed {
		if v := rep.header.Values(h); len(v) > 0 {
			t.Errorf("replay carries %s: %q", h, v)
		}
	}
	// Date is set by net/http on every response; it must be fresh, not the
	// handler's stored one.
	if rep.header.Get("Date") == "Mon, 02 Jan 2006 15:04:05 GMT" {
		t.Errorf("replay carries the stored Date")
	}
	for _, h := range []string{"Content-Type", "Location", "ETag"} {
		if rep.header.Get(h) != first.header.Get(h) {
			t.Errorf("allow-listed %s: %q, first %q", h, rep.header.Get(h), first.header.Get(h))
		}
	}
	// Nothing secret is even stored.
	rec, err := env.store.Get(context.Background(), "alice", "hdr")
	if err != nil || rec.Response == nil {
		t.Fatal(rec, err)
	}
	for name, v := range rec.Response.Header {
		if strings.Contains(strings.Join(v, ","), "secret") || strings.Contains(strings.Join(v, ","), "token") {
			t.Errorf("stored header %s: %q", name, v)
		}
	}
	for _, h := range tenancyNeverReplayed {
		if _, ok := rec.Response.Header[h]; ok {
			t.Errorf("stored header %s", h)
		}
	}
	// Asking for them is a configuration error, however spelled.
	for _, h := range []string{"set-cookie", "Set-Cookie", "WWW-Authenticate", "authorization",
		"Proxy-Authorization", "Proxy-Authenticate", "Connection", "Keep-Alive", "Transfer-Encoding",
		"Upgrade", "TE", "Trailer", "Date", "Content-Length", "Idempotent-Replayed"} {
		if _, err := core.New(memstore.New(), core.WithReplayHeaders("Content-Type", h)); err == nil {
			t.Errorf("WithReplayHeaders(%q) accepted", h)
		}
	}
}

func tenancyRandom(t *testing.T) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// TestTenancyLogsRedactKeysAndBodies drives every decision the engine logs
// (claim, commit, replay, mismatch, conflict, rejected, store error, abort)
// at debug level and checks the output never holds the key, the body, or
// the fingerprint — while its redacted form is there, so the check looks at
// the lines that would carry it.
func TestTenancyLogsRedactKeysAndBodies(t *testing.T) {
	{
		t.Run("redacted", func(t *testing.T) {
			logs := &idemtest.LogBuffer{}
			logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			block := make(chan struct{})
			store := memstore.New(memstore.WithMaxEntries(2))
			key := "KEY-" + tenancyRandom(t)
			secret := "BODY-" + tenancyRandom(t)
			env := newTenancyEnv(t, store, nil, core.WithLogger(logger), core.WithLease(time.Second))
			body := `{"card":"` + secret + `"}`

			env.post("alice", key, body)               // claim, commit
			env.post("alice", key, body)               // replay
			env.post("alice", key, `{"card":"other"}`) // mismatch
			env.post("alice", key+"-2", body)          // claim: the store is now full
			env.post("alice", key+"-full", body)       // store error (full)
			env.post("alice", "bad key "+secret, body) // rejected: invalid key
			env.post("", key, body)                    // rejected: no scope
			blocked := newTenancyEnv(t, nil, block, core.WithLogger(logger))
			go func() {
				req, _ := http.NewRequest(http.MethodPost, blocked.url+"/pay", strings.NewReader(body))
				req.Header.Set("X-User-ID", "bob")
				req.Header.Set("Idempotency-Key", key)
				if resp, err := blocked.client.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			blocked.waitRun("bob", key)
			deadline := time.Now().Add(5 * time.Second)
			blocked.post("bob", key, body) // conflict
			close(block)

			rec, err := store.Get(context.Background(), "alice", key)
			if err != nil {
				t.Fatal(err)
			}
			// The engine's lines arrive after the response; wait for the last kinds.
			for !strings.Contains(logs.String(), `idem: conflict`) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			out := logs.String()
			for _, kind := range []string{"claim", "commit", "replay", "mismatch", "store_error", "rejected", "conflict"} {
				if !strings.Contains(out, `"idem: `+kind+`"`) {
					t.Errorf("no %q line logged; the test does not cover it", kind)
				}
			}
			if strings.Contains(out, secret) {
				t.Errorf("a request body reached the logs")
			}
			if strings.Contains(out, rec.Fingerprint) || strings.Contains(out, rec.Fingerprint[:16]) {
				t.Errorf("a fingerprint reached the logs")
			}
			if strings.Contains(out, "private-data-of") {
				t.Errorf("a response body reached the logs")
			}
			if !strings.Contains(out, core.RedactKey(key)) {
				t.Errorf("no line names the key's redacted form; the check sees nothing")
			}
			if strings.Contains(out, key) || strings.Contains(out, strings.TrimPrefix(key, "KEY-")) {
				t.Errorf("a key reached the logs by default")
			}
			if !strings.Contains(out, `"key":"sha256:`) {
				t.Errorf("no redacted key in the logs:\n%s", out)
			}
		})
	}
}

// TestTenancyEmptyScopeFailsClosed: a scope function that answers ("", nil)
// (a header read blindly, a session without a user) must not put the
// request into the "" key space shared by every other such request: it is
// refused like a request with no scope (401 scope-unavailable), the handler
// does not run and nothing is claimed, unless the engine opted into one
// shared key space.
func TestTenancyEmptyScopeFailsClosed(t *testing.T) {
	empty := func(context.Context, *core.Request) (string, error) { return "", nil }
	for _, c := range []struct {
		name string
		opts []core.Option
		req  func(core.Request) core.Request
	}{
		{"Request.ScopeFunc", nil, func(r core.Request) core.Request { r.ScopeFunc = empty; return r }},
		{"core.WithScope", []core.Option{core.WithScope(func(context.Context, *core.Request) (string, error) { return "", nil })},
			func(r core.Request) core.Request { return r }},
	} {
		t.Run("engine/"+c.name, func(t *testing.T) {
			store := memstore.New()
			var events []core.Event
			eng, err := core.New(store, append([]core.Option{core.WithObserver(func(ev core.Event) { events = append(events, ev) })}, c.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			req := c.req(core.Request{Method: http.MethodPost, Route: "/pay", Target: "/pay",
				Header: http.Header{"Idempotency-Key": {"k-empty"}}, Body: strings.NewReader("{}")})
			d, err := eng.Decide(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			status := 0
			if d.Response != nil {
				status = d.Response.Status
			}
			if d.Outcome != core.Reject || d.Problem != problem.ScopeUnavailable || status != http.StatusUnauthorized {
				t.Errorf("empty scope: outcome %v problem %q status %d, want reject %q 401",
					d.Outcome, d.Problem, status, problem.ScopeUnavailable)
			}
			if d.Outcome == core.Proceed {
				_ = eng.Abort(context.Background(), d, nil)
			}
			if n := store.Len(); n != 0 {
				t.Errorf("%d records claimed for an empty scope", n)
			}
			if len(events) != 1 || events[0].Kind != core.EventRejected || !errors.Is(events[0].Err, core.ErrNoScope) {
				t.Errorf("events %+v, want one rejection carrying ErrNoScope", events)
			}

			// Opted into one shared key space: "" is then a scope like any other.
			shared, err := core.New(memstore.New(), append([]core.Option{core.WithSharedKeySpace()}, c.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			req = c.req(core.Request{Method: http.MethodPost, Route: "/pay", Target: "/pay",
				Header: http.Header{"Idempotency-Key": {"k-empty"}}, Body: strings.NewReader("{}")})
			d, err = shared.Decide(context.Background(), req)
			if err != nil || d.Outcome != core.Proceed || d.Scope != "" {
				t.Fatalf("WithSharedKeySpace: outcome %v scope %q err %v, want proceed in scope \"\"", d.Outcome, d.Scope, err)
			}
			if err := shared.Abort(context.Background(), d, nil); err != nil {
				t.Error(err)
			}
		})
	}

	// Through nethttpidem, with the scope function a careless service
	// writes: the header, whatever it holds. Two anonymous clients sending
	// the same key must not share a record (the second would get the
	// first's response).
	t.Run("nethttpidem", func(t *testing.T) {
		for _, sharedSpace := range []bool{false, true} {
			t.Run(fmt.Sprintf("shared=%v", sharedSpace), func(t *testing.T) {
				store := memstore.New()
				var opts []core.Option
				if sharedSpace {
					opts = append(opts, core.WithSharedKeySpace())
				}
				eng, err := core.New(store, opts...)
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				runs := 0
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					runs++
					mu.Unlock()
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, `{"secret":%q}`, r.Header.Get("X-Secret"))
				})
				mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
					return r.Header.Get("X-User-ID"), nil
				}))
				if err != nil {
					t.Fatal(err)
				}
				mux := http.NewServeMux()
				mux.Handle("POST /pay", mw(h))
				srv := httptest.NewServer(mux)
				defer srv.Close()
				post := func(secret string) (int, string, string) {
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader("{}"))
					req.Header.Set("Idempotency-Key", "anon-key")
					req.Header.Set("X-Secret", secret)
					resp, err := srv.Client().Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					b, _ := io.ReadAll(resp.Body)
					var p problem.Details
					_ = json.Unmarshal(b, &p)
					return resp.StatusCode, p.Type, string(b)
				}
				s1, typ1, _ := post("first-client")
				s2, typ2, body2 := post("second-client")
				if sharedSpace {
					// The documented risk of the opt-in: the second gets the first's response.
					if s1 != 201 || s2 != 201 || !strings.Contains(body2, "first-client") || runs != 1 {
						t.Errorf("shared key space: %d then %d %s, %d runs", s1, s2, body2, runs)
					}
					return
				}
				want := problem.BaseURI + problem.ScopeUnavailable
				if s1 != 401 || typ1 != want || s2 != 401 || typ2 != want {
					t.Errorf("empty scope: %d %q then %d %q, want 401 %q", s1, typ1, s2, typ2, want)
				}
				if strings.Contains(body2, "first-client") {
					t.Errorf("the second anonymous client got the first's response: %s", body2)
				}
				if runs != 0 || store.Len() != 0 {
					t.Errorf("handler ran %d times, %d records stored", runs, store.Len())
				}
			})
		}
	})
}
