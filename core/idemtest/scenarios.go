package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// scenarios is the table Run walks. Names are stable: adapter authors pick
// them with -run.
var scenarios = []scenario{
	{"first_request_runs_once_and_stores", scFirstRequest},
	{"replay_identical", scReplayIdentical},
	{"sf_string_key_same_as_token", scSFStringKey},
	{"payload_mismatch_422", scPayloadMismatch},
	{"payload_mismatch_422_while_in_flight", scPayloadMismatchInFlight},
	{"in_flight_409_retry_after", scInFlight409},
	{"wait_mode_replays_to_waiters", scWaitMode},
	{"concurrent_100_once_others_409", scConcurrent100},
	{"concurrent_100_wait_all_201", scConcurrent100Wait},
	{"server_error_retryable", scServerErrorRetryable},
	{"panic_500_releases_key", scPanic},
	{"safe_method_bypass", scSafeMethodBypass},
	{"no_key_optional_bypass", scNoKeyOptional},
	{"missing_key_400", scMissingKey},
	{"invalid_key_400", scInvalidKey},
	{"request_too_large_413", scTooLarge},
	{"store_down_503", scStoreDown},
	{"scope_isolation", scScopeIsolation},
	{"set_cookie_never_replayed", scSetCookie},
	{"handler_sees_body_and_key", scHandlerSeesBodyAndKey},
	{"large_response_not_retained", scLargeResponse},
	{"empty_response_stored", scEmptyResponse},
	{"unrecorded_streamed_response_never_a_complete_2xx", scUnrecordedStreamed},
	{"handler_stopped_by_a_lost_lease_409", scLostLease},
}

// payHandler answers 201 with a JSON body that includes the execution
// number, so a replay that re-ran the handler cannot look identical.
func payHandler(n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/pay/%d", i))
		w.Header().Set("ETag", fmt.Sprintf(`"v%d"`, i))
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":"pay_%d","tenant":%q,"request":%q}`, i, r.Header.Get(ScopeHeader), body)
	})
}

// blockingPayHandler is payHandler that first blocks on g.
func blockingPayHandler(n *atomic.Int64, g *gate) http.Handler {
	inner := payHandler(n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.block()
		inner.ServeHTTP(w, r)
	})
}

func count(t *testing.T, n *atomic.Int64, want int64) {
	t.Helper()
	if got := n.Load(); got != want {
		t.Errorf("handler ran %d times, want %d", got, want)
	}
}

const payBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

func scFirstRequest(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil)
	key, tenant := e.key("first"), e.tenant("a")
	r := e.do(call{method: "POST", path: "/pay", key: key, tenant: tenant, body: payBody})
	if r.status != http.StatusCreated {
		t.Fatalf("status = %d, want 201; %v", r.status, r)
	}
	if replayed(r) {
		t.Errorf("first response carries %s", core.ReplayedHeader)
	}
	if want := `{"id":"pay_1"`; !bytes.HasPrefix(r.body, []byte(want)) {
		t.Errorf("body = %q, want prefix %q", r.body, want)
	}
	count(t, &n, 1)
	rec, err := e.record(tenant, key)
	if err != nil {
		t.Fatalf("store.Get(%q, %q): %v (is the scope the %s header, verbatim?)", tenant, key, err, ScopeHeader)
	}
	if rec.Status != storekit.StatusCompleted || rec.Response == nil {
		t.Fatalf("record status = %s, response %v; want completed with a response", rec.Status, rec.Response)
	}
	if rec.Response.Status != http.StatusCreated || !bytes.Equal(rec.Response.Body, r.body) {
		t.Errorf("stored response = %d %q, want 201 %q", rec.Response.Status, rec.Response.Body, r.body)
	}
	// The route is the framework's template: "/pay", or "POST /pay" for
	// an http.ServeMux pattern.
	if rec.Method != "POST" || !strings.HasSuffix(rec.Route, "/pay") {
		t.Errorf("record method/route = %q %q, want POST and a route template ending in /pay", rec.Method, rec.Route)
	}
}

func scReplayIdentical(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil)
	c := call{method: "POST", path: "/pay", key: e.key("replay"), tenant: e.tenant("a"), body: payBody}
	first := e.do(c)
	if first.status != http.StatusCreated {
		t.Fatalf("first: status = %d, want 201; %v", first.status, first)
	}
	for i := range 3 {
		replay := e.do(c)
		t.Run(fmt.Sprintf("replay%d", i+1), func(t *testing.T) { sameResponse(t, first, replay) })
	}
	count(t, &n, 1)
}

func scSFStringKey(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil)
	key := e.key("sf")
	first := e.do(call{method: "POST", path: "/pay", key: `"` + key + `"`, tenant: e.tenant("a"), body: payBody})
	if first.status != http.StatusCreated {
		t.Fatalf("first (sf-string key): status = %d, want 201; %v", first.status, first)
	}
	replay := e.do(call{method: "POST", path: "/pay", key: key, tenant: e.tenant("a"), body: payBody})
	sameResponse(t, first, replay)
	count(t, &n, 1)
}

func scPayloadMismatch(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil)
	key, tenant := e.key("mismatch"), e.tenant("a")
	first := e.do(call{method: "POST", path: "/pay", key: key, tenant: tenant, body: payBody})
	if first.status != http.StatusCreated {
		t.Fatalf("first: status = %d, want 201; %v", first.status, first)
	}
	r := e.do(call{method: "POST", path: "/pay", key: key, tenant: tenant, body: `{"amount":50000,"currency":"JPY","to":"alice"}`})
	requireProblem(t, r, http.StatusUnprocessableEntity, problem.PayloadMismatch)
	if replayed(r) {
		t.Errorf("422 carries %s", core.ReplayedHeader)
	}
	// The original is still replayed to the original request.
	sameResponse(t, first, e.do(call{method: "POST", path: "/pay", key: key, tenant: tenant, body: payBody}))
	count(t, &n, 1)
}

func scPayloadMismatchInFlight(t *testing.T, e *env) {
	var n atomic.Int64
	g := newGate()
	e.start([]Route{{"POST", "/pay", blockingPayHandler(&n, g)}}, nil)
	e.openOnCleanup(g)
	c := call{method: "POST", path: "/pay", key: e.key("mismatch-inflight"), tenant: e.tenant("a"), body: payBody}
	firstCh := e.sendAll(1, c)
	if !g.waitEntered(waitTimeout) {
		g.Open()
		t.Fatal("first request never reached the handler")
	}
	other := c
	other.body = `{"amount":50000,"currency":"JPY","to":"alice"}`
	r := e.do(other)
	requireProblem(t, r, http.StatusUnprocessableEntity, problem.PayloadMismatch)
	g.Open()
	first := <-firstCh
	if first.status != http.StatusCreated {
		t.Errorf("first: status = %d, want 201; %v", first.status, first)
	}
	count(t, &n, 1)
}

func scInFlight409(t *testing.T, e *env) {
	var n atomic.Int64
	g := newGate()
	e.start([]Route{{"POST", "/pay", blockingPayHandler(&n, g)}}, nil)
	e.openOnCleanup(g)
	c := call{method: "POST", path: "/pay", key: e.key("inflight"), tenant: e.tenant("a"), body: payBody}
	firstCh := e.sendAll(1, c)
	if !g.waitEntered(waitTimeout) {
		g.Open()
		t.Fatal("first request never reached the handler")
	}
	const dups = 20
	got := 0
	timeout := time.After(waitTimeout)
	dupCh := e.sendAll(dups, c)
collect:
	for got < dups {
		select {
		case r, ok := <-dupCh:
			if !ok {
				break collect
			}
			got++
			requireProblem(t, r, http.StatusConflict, problem.InFlight)
			retryAfter(t, r)
		case <-timeout:
			t.Errorf("only %d of %d duplicates answered while the first was in flight (did they run the handler?)", got, dups)
			break collect
		}
	}
	g.Open()
	first := <-firstCh
	if first.status != http.StatusCreated {
		t.Errorf("first: status = %d, want 201; %v", first.status, first)
	}
	for range dupCh { // drain stragglers after a timeout
	}
	count(t, &n, 1)
	sameResponse(t, first, e.do(c))
	count(t, &n, 1)
}

func scWaitMode(t *testing.T, e *env) {
	var n atomic.Int64
	g := newGate()
	e.start([]Route{{"POST", "/pay", blockingPayHandler(&n, g)}}, nil, core.WithWait(waitTimeout), core.WithWaitPoll(10*time.Millisecond))
	e.openOnCleanup(g)
	c := call{method: "POST", path: "/pay", key: e.key("wait"), tenant: e.tenant("a"), body: payBody}
	firstCh := e.sendAll(1, c)
	if !g.waitEntered(waitTimeout) {
		g.Open()
		t.Fatal("first request never reached the handler")
	}
	const dups = 5
	// Release the first only once every duplicate has been told the key is
	// in flight, and so waits: the store holds those answers until then.
	release := e.store.holdInFlight()
	defer release()
	dupCh := e.sendAll(dups, c)
	if !waitUntil(waitTimeout, func() bool { return e.store.heldInFlight() >= dups }) {
		t.Errorf("%d of %d duplicates were told the key is in flight (%d claims), want all", e.store.heldInFlight(), dups, e.store.claims.Load())
	}
	release()
	g.Open()
	first := <-firstCh
	if first.status != http.StatusCreated {
		t.Fatalf("first: status = %d, want 201; %v", first.status, first)
	}
	for r := range dupCh {
		sameResponse(t, first, r)
	}
	count(t, &n, 1)
}

func scConcurrent100(t *testing.T, e *env) {
	var n atomic.Int64
	g := newGate()
	e.start([]Route{{"POST", "/pay", blockingPayHandler(&n, g)}}, nil)
	e.openOnCleanup(g)
	const total = 100
	c := call{method: "POST", path: "/pay", key: e.key("c100"), tenant: e.tenant("a"), body: payBody}
	ch := e.sendAll(total, c)
	var conflicts, created int
	var first *result
	timeout := time.After(waitTimeout)
	for done := false; !done; {
		select {
		case r, ok := <-ch:
			if !ok {
				done = true
				break
			}
			switch r.status {
			case http.StatusConflict:
				conflicts++
				requireProblem(t, r, http.StatusConflict, problem.InFlight)
			case http.StatusCreated:
				created++
				first = r
			default:
				t.Errorf("unexpected response %v", r)
			}
			if conflicts == total-1 {
				g.Open() // every duplicate answered while the owner was blocked
			}
		case <-timeout:
			t.Errorf("timed out with %d conflicts, %d created; releasing the handler", conflicts, created)
			g.Open()
			timeout = nil // keep draining: the client timeout bounds the rest
		}
	}
	g.Open()
	if created != 1 || conflicts != total-1 {
		t.Errorf("got %d x 201 and %d x 409, want 1 and %d", created, conflicts, total-1)
	}
	count(t, &n, 1)
	if first != nil {
		sameResponse(t, first, e.do(c))
	}
}

func scConcurrent100Wait(t *testing.T, e *env) {
	var n atomic.Int64
	g := newGate()
	e.start([]Route{{"POST", "/pay", blockingPayHandler(&n, g)}}, nil, core.WithWait(waitTimeout), core.WithWaitPoll(10*time.Millisecond))
	e.openOnCleanup(g)
	const total = 100
	c := call{method: "POST", path: "/pay", key: e.key("c100w"), tenant: e.tenant("a"), body: payBody}
	// Release the owner only once every other request has been told the key
	// is in flight, and so waits: the store holds those answers until then.
	release := e.store.holdInFlight()
	defer release()
	ch := e.sendAll(total, c)
	if !waitUntil(waitTimeout, func() bool { return e.store.heldInFlight() >= total-1 }) {
		t.Errorf("%d of %d duplicates were told the key is in flight (%d claims), want all", e.store.heldInFlight(), total-1, e.store.claims.Load())
	}
	release()
	g.Open()
	var bodies = map[string]int{}
	var fresh int
	for r := range ch {
		if r.status != http.StatusCreated {
			t.Errorf("status = %d, want 201; %v", r.status, r)
			continue
		}
		bodies[string(r.body)]++
		if !replayed(r) {
			fresh++
		}
	}
	if len(bodies) != 1 {
		t.Errorf("got %d distinct bodies, want 1: %v", len(bodies), bodies)
	}
	if fresh != 1 {
		t.Errorf("%d responses lack %s, want exactly 1 (the owner's)", fresh, core.ReplayedHeader)
	}
	count(t, &n, 1)
}

func scServerErrorRetryable(t *testing.T, e *env) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			http.Error(w, "provider down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"pay_2"}`)
	})
	e.start([]Route{{"POST", "/pay", h}}, nil)
	c := call{method: "POST", path: "/pay", key: e.key("5xx"), tenant: e.tenant("a"), body: payBody}
	if r := e.do(c); r.status != http.StatusInternalServerError {
		t.Fatalf("first: status = %d, want the handler's 500; %v", r.status, r)
	}
	second := e.do(c)
	if second.status != http.StatusCreated || replayed(second) {
		t.Fatalf("retry after 500: %v replayed=%v, want a fresh 201", second, replayed(second))
	}
	count(t, &n, 2)
	sameResponse(t, second, e.do(c))
	count(t, &n, 2)
}

func scPanic(t *testing.T, e *env) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			panic("idemtest: deliberate handler panic")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"pay_2"}`)
	})
	e.start([]Route{{"POST", "/pay", h}}, nil)
	c := call{method: "POST", path: "/pay", key: e.key("panic"), tenant: e.tenant("a"), body: payBody}
	r, err := e.send(c)
	if err != nil {
		t.Fatalf("panicking handler: %v (want a 500 problem, not a dropped connection)", err)
	}
	requireProblem(t, r, http.StatusInternalServerError, problem.HandlerPanic)
	second := e.do(c)
	if second.status != http.StatusCreated || replayed(second) {
		t.Fatalf("retry after panic: %v replayed=%v, want a fresh 201 (key released)", second, replayed(second))
	}
	count(t, &n, 2)
}

func scSafeMethodBypass(t *testing.T, e *env) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "get %d", n.Add(1))
	})
	e.start([]Route{{"GET", "/pay", h}}, nil)
	for i, key := range []string{e.key("get"), e.key("get"), ""} {
		r := e.do(call{method: "GET", path: "/pay", key: key, tenant: e.tenant("a")})
		if want := fmt.Sprintf("get %d", i+1); r.status != http.StatusOK || string(r.body) != want || replayed(r) {
			t.Errorf("GET %d: %v replayed=%v, want 200 %q fresh", i+1, r, replayed(r), want)
		}
	}
	count(t, &n, 3)
	if _, err := e.record(e.tenant("a"), e.key("get")); err == nil {
		t.Errorf("a GET left a record in the store")
	}
}

func scNoKeyOptional(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil, core.WithKeyRequired(false))
	c := call{method: "POST", path: "/pay", tenant: e.tenant("a"), body: payBody}
	for i := range 2 {
		r := e.do(c)
		if r.status != http.StatusCreated || replayed(r) {
			t.Errorf("request %d without a key: %v replayed=%v, want a fresh 201", i+1, r, replayed(r))
		}
	}
	count(t, &n, 2)
	// A keyed request is still protected.
	c.key = e.key("optional")
	first := e.do(c)
	sameResponse(t, first, e.do(c))
	count(t, &n, 3)
}

func scMissingKey(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil)
	r := e.do(call{method: "POST", path: "/pay", tenant: e.tenant("a"), body: payBody})
	requireProblem(t, r, http.StatusBadRequest, problem.MissingKey)
	count(t, &n, 0)
}

func scInvalidKey(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil)
	cases := []struct {
		name string
		c    call
	}{
		{"256_bytes", call{key: strings.Repeat("a", 256)}},
		{"control_char", call{key: "abc\tdef"}},
		{"non_ascii", call{key: "ключ"}},
		{"space", call{key: "abc def"}},
		{"two_header_lines", call{keys: []string{e.key("one"), e.key("two")}}},
		{"list", call{key: `"a", "b"`}},
		{"unterminated_quote", call{key: `"abc`}},
		{"bad_escape", call{key: `"a\nb"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			c.method, c.path, c.tenant, c.body = "POST", "/pay", e.tenant("a"), payBody
			r, err := e.send(c)
			if err != nil {
				t.Fatal(err)
			}
			requireProblem(t, r, http.StatusBadRequest, problem.InvalidKey)
		})
	}
	// 255 bytes is the longest valid key.
	if r := e.do(call{method: "POST", path: "/pay", key: strings.Repeat("b", 255-len(e.id)) + e.id, tenant: e.tenant("a"), body: payBody}); r.status != http.StatusCreated {
		t.Errorf("255-byte key: %v, want 201", r)
	}
	count(t, &n, 1)
}

func scTooLarge(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil, core.WithMaxRequestBytes(64))
	key := e.key("big")
	r := e.do(call{method: "POST", path: "/pay", key: key, tenant: e.tenant("a"), body: `{"memo":"` + strings.Repeat("x", 100) + `"}`})
	requireProblem(t, r, http.StatusRequestEntityTooLarge, problem.BodyTooLarge)
	count(t, &n, 0)
	// Exactly at the limit is fine, and the key was not consumed.
	body := `{"m":"` + strings.Repeat("y", 64-8) + `"}`
	if len(body) != 64 {
		t.Fatalf("test bug: body is %d bytes", len(body))
	}
	if r := e.do(call{method: "POST", path: "/pay", key: key, tenant: e.tenant("a"), body: body}); r.status != http.StatusCreated {
		t.Errorf("64-byte body: %v, want 201", r)
	}
	count(t, &n, 1)
}

func scStoreDown(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, func(s core.Store) core.Store { return FailingStore{Store: s} })
	r := e.do(call{method: "POST", path: "/pay", key: e.key("down"), tenant: e.tenant("a"), body: payBody})
	requireProblem(t, r, http.StatusServiceUnavailable, problem.StoreUnavailable)
	retryAfter(t, r)
	count(t, &n, 0)
}

func scScopeIsolation(t *testing.T, e *env) {
	var n atomic.Int64
	e.start([]Route{{"POST", "/pay", payHandler(&n)}}, nil)
	key := e.key("shared")
	ca := call{method: "POST", path: "/pay", key: key, tenant: e.tenant("A"), body: payBody}
	cb := call{method: "POST", path: "/pay", key: key, tenant: e.tenant("B"), body: `{"amount":7,"currency":"JPY","to":"bob"}`}
	a := e.do(ca)
	b := e.do(cb)
	if a.status != http.StatusCreated || b.status != http.StatusCreated || replayed(b) {
		t.Fatalf("tenants A and B with the same key: %v, %v (B replayed=%v); want two fresh 201s", a, b, replayed(b))
	}
	if bytes.Equal(a.body, b.body) {
		t.Errorf("tenant B got tenant A's body %q", a.body)
	}
	count(t, &n, 2)
	sameResponse(t, a, e.do(ca))
	sameResponse(t, b, e.do(cb))
	count(t, &n, 2)
}

func scSetCookie(t *testing.T, e *env) {
	var n atomic.Int64
	const oldDate = "Mon, 01 Jan 2001 00:00:00 GMT"
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("ETag", `"abc"`)
		w.Header().Add("Link", `</a>; rel="a"`)
		w.Header().Add("Link", `</b>; rel="b"`)
		w.Header().Set("Set-Cookie", "session=secret; Path=/; HttpOnly")
		w.Header().Set("Date", oldDate)
		w.Header().Set("X-Not-Allowed", "1")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	e.start([]Route{{"POST", "/pay", h}}, nil)
	key, tenant := e.key("cookie"), e.tenant("a")
	c := call{method: "POST", path: "/pay", key: key, tenant: tenant, body: payBody}
	first := e.do(c)
	if first.status != http.StatusCreated || first.header.Get("Set-Cookie") == "" {
		t.Fatalf("first: %v with Set-Cookie %q; want 201 with the handler's cookie", first, first.header.Get("Set-Cookie"))
	}
	replay := e.do(c)
	sameResponse(t, first, replay)
	if v := replay.header.Values("Set-Cookie"); len(v) > 0 {
		t.Errorf("replay carries Set-Cookie %q", v)
	}
	if v := replay.header.Get("X-Not-Allowed"); v != "" {
		t.Errorf("replay carries a header outside the allow-list: X-Not-Allowed: %q", v)
	}
	if v := replay.header.Get("Date"); v == oldDate {
		t.Errorf("replay carries the stored Date %q", v)
	}
	if got := replay.header.Values("Link"); len(got) != 2 {
		t.Errorf("replay Link = %q, want both values", got)
	}
	rec, err := e.record(tenant, key)
	if err != nil || rec.Response == nil {
		t.Fatalf("store.Get: %v, %+v", err, rec)
	}
	allowed := map[string]bool{}
	for _, h := range ReplayHeaders() {
		allowed[http.CanonicalHeaderKey(h)] = true
	}
	for k := range rec.Response.Header {
		if !allowed[http.CanonicalHeaderKey(k)] {
			t.Errorf("stored header %s is not in the replay allow-list", k)
		}
	}
	count(t, &n, 1)
}

func scHandlerSeesBodyAndKey(t *testing.T, e *env) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		body, err := io.ReadAll(r.Body)
		key, ok := core.KeyFromContext(r.Context())
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, "err=%v\nkey=%s ok=%v\nrelay=%s\nbody=%s", err, key, ok, core.RelayKey(r.Context(), "provider"), body)
	})
	e.start([]Route{{"POST", "/pay", h}}, nil)
	key, tenant := e.key("echo"), e.tenant("a")
	body := `{"amount":1000,"memo":"` + strings.Repeat("é", 1000) + `"}`
	r := e.do(call{method: "POST", path: "/pay", key: key, tenant: tenant, body: body})
	if r.status != http.StatusCreated {
		t.Fatalf("status = %d, want 201; %v", r.status, r)
	}
	rec, err := e.record(tenant, key)
	if err != nil {
		t.Fatalf("store.Get: %v", err)
	}
	relay := e.eng.RelayKeyOf(rec, "provider") // per record: core.RelayKey
	want := fmt.Sprintf("err=<nil>\nkey=%s ok=true\nrelay=%s\nbody=%s", key, relay, body)
	if string(r.body) != want {
		t.Errorf("handler saw:\n%s\nwant:\n%s", trunc(r.body), trunc([]byte(want)))
	}
	count(t, &n, 1)
}

func scLargeResponse(t *testing.T, e *env) {
	var n atomic.Int64
	big := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		for i := 0; i < len(big); i += 1000 {
			_, _ = w.Write(big[i:min(i+1000, len(big))])
		}
	})
	e.start([]Route{{"POST", "/pay", h}}, nil, core.WithMaxResponseBytes(1024))
	c := call{method: "POST", path: "/pay", key: e.key("large"), tenant: e.tenant("a"), body: payBody}
	first := e.do(c)
	if first.status != http.StatusCreated || !bytes.Equal(first.body, big) {
		t.Fatalf("first: status %d, %d body bytes (intact=%v); want 201 with all %d bytes", first.status, len(first.body), bytes.Equal(first.body, big), len(big))
	}
	r := e.do(c)
	requireProblem(t, r, http.StatusConflict, problem.NotRetained)
	count(t, &n, 1)
}

func scEmptyResponse(t *testing.T, e *env) {
	var n atomic.Int64
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { n.Add(1) })
	e.start([]Route{{"POST", "/pay", h}}, nil)
	c := call{method: "POST", path: "/pay", key: e.key("empty"), tenant: e.tenant("a"), body: payBody}
	first := e.do(c)
	if first.status != http.StatusOK || len(first.body) != 0 {
		t.Fatalf("first: %v, want 200 with an empty body", first)
	}
	replay := e.do(c)
	if replay.status != http.StatusOK || len(replay.body) != 0 || !replayed(replay) {
		t.Errorf("replay: %v replayed=%v, want 200 empty replayed", replay, replayed(replay))
	}
	count(t, &n, 1)
}

// completeDownStore fails every Complete, as a database lost between the
// claim and the commit; Fail reaches the wrapped store.
type completeDownStore struct{ core.Store }

func (completeDownStore) Complete(context.Context, storekit.Fence, storekit.StoredResponse) error {
	return errors.New("idemtest: complete: store down")
}

// scUnrecordedStreamed: a response that goes out before its outcome is
// recorded (flushed, or over the response limit) and whose Commit then
// fails must not reach the client as a complete 2xx: the record was not
// completed, so a retry runs the handler again. The client sees the
// response cut (or, where the framework buffers it, idem's problem).
func scUnrecordedStreamed(t *testing.T, e *env) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 256) // 4 KiB
	flushed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"pay_1",`)
		_ = http.NewResponseController(w).Flush() // not every framework streams
		_, _ = io.WriteString(w, `"status":"charged"}`)
	})
	large := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(big)
	})
	e.start([]Route{{"POST", "/flush", flushed}, {"POST", "/large", large}},
		func(s core.Store) core.Store { return completeDownStore{Store: s} }, core.WithMaxResponseBytes(1024))
	for _, path := range []string{"/flush", "/large"} {
		r, err := e.send(call{method: "POST", path: path, key: e.key("cut" + path), tenant: e.tenant("a"), body: payBody})
		if err == nil && r.status >= 200 && r.status < 300 {
			t.Errorf("%s: the client got a complete %v for an outcome that was not recorded", path, r)
		}
	}
}

// heartbeatDownStore fails every Heartbeat, as a database lost after the
// claim: the lease runs out and idem stops the handler.
type heartbeatDownStore struct{ core.Store }

func (heartbeatDownStore) Heartbeat(context.Context, storekit.Fence, time.Duration) error {
	return errors.New("idemtest: heartbeat: store down")
}

// scLostLease: a handler that idem stops because its lease is gone (its
// context cancelled) and that returns without writing, as handlers do on
// a cancelled context, must not reach the client as a 200 with an empty
// body, which reads as success: the key was released, nothing recorded.
// The client gets the lease-lost 409 (retry), and a retry runs the handler
// again.
func scLostLease(t *testing.T, e *env) {
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second): // a framework that never cancels fails below
		}
	})
	e.start([]Route{{"POST", "/pay", h}}, func(s core.Store) core.Store { return heartbeatDownStore{Store: s} },
		core.WithLease(300*time.Millisecond))
	c := call{method: "POST", path: "/pay", key: e.key("lost"), tenant: e.tenant("a"), body: payBody}
	requireProblem(t, e.do(c), http.StatusConflict, problem.InFlight)
	requireProblem(t, e.do(c), http.StatusConflict, problem.InFlight)
	count(t, &n, 2)
}
