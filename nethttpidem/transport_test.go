package nethttpidem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// attempt is what the test server saw on one request.
type attempt struct {
	method string
	key    string
	keys   int // number of key header lines
	body   string
	at     time.Time
}

// recorder is a test server that records every attempt and answers the
// n-th one with reply(n, w, r) (n counts from 0).
type recorder struct {
	mu       sync.Mutex
	attempts []attempt
	srv      *httptest.Server
}

func newRecorder(t *testing.T, reply func(n int, w http.ResponseWriter, r *http.Request)) *recorder {
	t.Helper()
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("server: read body: %v", err)
		}
		rec.mu.Lock()
		n := len(rec.attempts)
		rec.attempts = append(rec.attempts, attempt{
			method: r.Method,
			key:    r.Header.Get("Idempotency-Key"),
			keys:   len(r.Header.Values("Idempotency-Key")),
			body:   string(body),
			at:     time.Now(),
		})
		rec.mu.Unlock()
		reply(n, w, r)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) seen() []attempt {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]attempt(nil), rec.attempts...)
}

func inFlight(w http.ResponseWriter, retryAfter string) {
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(http.StatusConflict)
	_, _ = io.WriteString(w, `{"type":"https://idemkit.dev/problems/in-flight","title":"Request with this idempotency key is in progress","status":409}`)
}

func created(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"id":"pay_1"}`)
}

// fast is a transport with tiny delays so tests of the retry sequence do
// not wait.
func fast(opts ...TransportOption) *Transport {
	return NewTransport(append([]TransportOption{WithBaseDelay(time.Millisecond), WithMaxDelay(5 * time.Millisecond)}, opts...)...)
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	return string(b)
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func assertSameKeyAndBody(t *testing.T, seen []attempt, wantN int, wantBody string) {
	t.Helper()
	if len(seen) != wantN {
		t.Fatalf("server saw %d attempts, want %d: %+v", len(seen), wantN, seen)
	}
	for i, a := range seen {
		if a.keys != 1 {
			t.Errorf("attempt %d carried %d key header lines, want 1", i, a.keys)
		}
		if a.key != seen[0].key {
			t.Errorf("attempt %d key %q, want the first attempt's %q", i, a.key, seen[0].key)
		}
		if a.body != wantBody {
			t.Errorf("attempt %d body %q, want %q", i, a.body, wantBody)
		}
	}
}

func TestTransportRetries409And503WithSameKey(t *testing.T) {
	const body = `{"amount":1000,"currency":"JPY","to":"alice"}`
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 0:
			inFlight(w, "0")
		case 1:
			w.Header().Set("Retry-After", "0")
			http.Error(w, "store down", http.StatusServiceUnavailable)
		case 2:
			http.Error(w, "busy", http.StatusConflict) // plain 409
		case 3:
			http.Error(w, "slow down", http.StatusTooManyRequests)
		default:
			created(w)
		}
	})
	req := post(t, context.Background(), rec.srv.URL, body)
	resp, err := (&http.Client{Transport: fast()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	if got := readAll(t, resp); got != `{"id":"pay_1"}` {
		t.Errorf("body %q", got)
	}
	seen := rec.seen()
	assertSameKeyAndBody(t, seen, 5, body)
	if !uuidV4.MatchString(seen[0].key) {
		t.Errorf("generated key %q is not a UUIDv4", seen[0].key)
	}
	if req.Header.Get("Idempotency-Key") != "" {
		t.Error("RoundTrip modified the caller's request header")
	}
}

func TestTransportRetries502And504(t *testing.T) {
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 0:
			w.WriteHeader(http.StatusBadGateway)
		case 1:
			w.WriteHeader(http.StatusGatewayTimeout)
		default:
			created(w)
		}
	})
	resp, err := fast().RoundTrip(post(t, context.Background(), rec.srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	assertSameKeyAndBody(t, rec.seen(), 3, "x")
}

func TestTransportKeepsExistingKey(t *testing.T) {
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		created(w)
	})
	req := post(t, context.Background(), rec.srv.URL, "{}")
	req.Header.Set("Idempotency-Key", `"order-42"`)
	resp, err := fast().RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	seen := rec.seen()
	assertSameKeyAndBody(t, seen, 2, "{}")
	if seen[0].key != `"order-42"` {
		t.Errorf("key %q, want the caller's %q", seen[0].key, `"order-42"`)
	}
}

func TestTransportCustomHeaderAndKeyFunc(t *testing.T) {
	var got []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("X-Request-Key")+"|"+r.Header.Get("Idempotency-Key"))
		n := len(got)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	calls := 0
	tr := fast(WithKeyHeader("x-request-key"), WithKeyFunc(func(r *http.Request) (string, error) {
		calls++
		return "k-" + r.Method, nil
	}), WithKeyMethods("put"))
	req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("b"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	if calls != 1 {
		t.Errorf("KeyFunc called %d times, want once per RoundTrip", calls)
	}
	if len(got) != 2 || got[0] != "k-PUT|" || got[1] != "k-PUT|" {
		t.Errorf("server saw %q, want the custom header on both attempts", got)
	}

	// POST is no longer a key method: sent once, untouched, not retried.
	got = nil
	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	if len(got) != 1 || got[0] != "|" {
		t.Errorf("unkeyed POST: server saw %q, want one attempt without a key", got)
	}
}

func TestTransportKeyFuncError(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	boom := errors.New("no entropy")
	for name, f := range map[string]func(*http.Request) (string, error){
		"error": func(*http.Request) (string, error) { return "", boom },
		"empty": func(*http.Request) (string, error) { return "", nil },
	} {
		resp, err := fast(WithKeyFunc(f)).RoundTrip(post(t, context.Background(), srv.URL, "b"))
		if err == nil {
			_ = resp.Body.Close()
			t.Errorf("%s: RoundTrip succeeded, want an error", name)
		}
	}
	if hits.Load() != 0 {
		t.Errorf("server hit %d times, want none", hits.Load())
	}
}

func TestTransportNeverRetriesFinalStatuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply func(w http.ResponseWriter)
	}{
		{"422 mismatch", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"type":"https://idemkit.dev/problems/payload-mismatch","status":422}`)
		}},
		{"400", func(w http.ResponseWriter) { w.WriteHeader(http.StatusBadRequest) }},
		{"401", func(w http.ResponseWriter) { w.WriteHeader(http.StatusUnauthorized) }},
		{"404", func(w http.ResponseWriter) { w.WriteHeader(http.StatusNotFound) }},
		{"500", func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }},
		{"409 not-retained", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"type":"https://idemkit.dev/problems/not-retained","status":409}`)
		}},
		{"201", created},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) { tc.reply(w) })
			resp, err := fast().RoundTrip(post(t, context.Background(), rec.srv.URL, "b"))
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			if n := len(rec.seen()); n != 1 {
				t.Errorf("server saw %d attempts, want 1", n)
			}
			if strings.Contains(tc.name, "not-retained") && !strings.Contains(body, "not-retained") {
				t.Errorf("peeked 409 body not handed back whole: %q", body)
			}
		})
	}
}

func TestTransportMaxAttempts(t *testing.T) {
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "attempt "+string(rune('0'+n)))
	})
	resp, err := fast(WithMaxAttempts(3)).RoundTrip(post(t, context.Background(), rec.srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d, want the last 503", resp.StatusCode)
	}
	if got := readAll(t, resp); got != "attempt 2" {
		t.Errorf("body %q, want the last attempt's, unread", got)
	}
	assertSameKeyAndBody(t, rec.seen(), 3, "b")
}

// hijackAndClose answers by dropping the connection: with reset, an RST
// (connection reset by peer); without, a plain close (EOF before any response).
func hijackAndClose(t *testing.T, w http.ResponseWriter, reset bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func TestTransportRetriesConnectionResetAndEOF(t *testing.T) {
	const body = `{"amount":1}`
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 0:
			hijackAndClose(t, w, true)
		case 1:
			hijackAndClose(t, w, false)
		default:
			created(w)
		}
	})
	// A fresh base transport so no pooled connection hides the failures.
	base := &http.Transport{DisableKeepAlives: true}
	defer base.CloseIdleConnections()
	c := &countingRT{base: base}
	resp, err := fast(WithBase(c)).RoundTrip(post(t, context.Background(), rec.srv.URL, body))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d %q, want 201", resp.StatusCode, got)
	}
	var resets, eofs int
	for _, e := range c.errs {
		switch {
		case errors.Is(e, syscall.ECONNRESET):
			resets++
		case errors.Is(e, io.EOF):
			eofs++
		}
	}
	if resets == 0 || eofs == 0 {
		t.Errorf("Transport saw errors %v, want a connection reset and an EOF among them", c.errs)
	}
	// net/http may itself resend a keyed request once on a dead connection;
	// whoever retried, every attempt carried the same key and body.
	seen := rec.seen()
	if len(seen) < 3 {
		t.Fatalf("server saw %d attempts, want at least 3", len(seen))
	}
	assertSameKeyAndBody(t, seen, len(seen), body)
}

// countingRT counts the attempts that reach base and records their errors.
type countingRT struct {
	base http.RoundTripper
	mu   sync.Mutex
	n    int
	errs []error
	keys []string
}

func (c *countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	c.mu.Lock()
	c.n++
	c.errs = append(c.errs, err)
	c.keys = append(c.keys, r.Header.Get("Idempotency-Key"))
	c.mu.Unlock()
	return resp, err
}

func TestTransportRetriesConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there any more: connection refused

	c := &countingRT{base: http.DefaultTransport}
	resp, err := fast(WithBase(c), WithMaxAttempts(3)).RoundTrip(post(t, context.Background(), "http://"+addr, "b"))
	if err == nil {
		_ = resp.Body.Close()
		t.Fatal("RoundTrip succeeded against a closed port")
	}
	if c.n != 3 {
		t.Errorf("%d attempts, want 3", c.n)
	}
	for i, k := range c.keys {
		if k == "" || k != c.keys[0] {
			t.Errorf("attempt %d key %q, want %q", i, k, c.keys[0])
		}
	}
}

func TestTransportDoesNotRetryOtherErrors(t *testing.T) {
	c := &countingRT{base: http.DefaultTransport}
	resp, err := fast(WithBase(c)).RoundTrip(post(t, context.Background(), "ftp://127.0.0.1/", "b"))
	if err == nil {
		_ = resp.Body.Close()
		t.Fatal("unsupported scheme succeeded")
	}
	if c.n != 1 {
		t.Errorf("%d attempts, want 1", c.n)
	}
}

func TestTransportHonoursRetryAfter(t *testing.T) {
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			inFlight(w, "1")
			return
		}
		created(w)
	})
	// Backoff alone would wait at most 5ms; only the hint explains a 1s wait.
	resp, err := fast(WithMaxDelay(5 * time.Second)).RoundTrip(post(t, context.Background(), rec.srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	seen := rec.seen()
	assertSameKeyAndBody(t, seen, 2, "b")
	if gap := seen[1].at.Sub(seen[0].at); gap < time.Second {
		t.Errorf("retried after %v, want at least the Retry-After of 1s", gap)
	}
}

func TestTransportRetryAfterCappedByMaxDelay(t *testing.T) {
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		created(w)
	})
	start := time.Now()
	resp, err := fast(WithMaxDelay(20 * time.Millisecond)).RoundTrip(post(t, context.Background(), rec.srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("status %d, want 201", resp.StatusCode)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("took %v: the Retry-After hour was not capped", took)
	}
	if gap := rec.seen()[1].at.Sub(rec.seen()[0].at); gap < 20*time.Millisecond {
		t.Errorf("retried after %v, want the max delay (20ms) when the hint exceeds it", gap)
	}
}

func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 2 ", 2 * time.Second, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Fri, 02 Jan 2026 03:04:15 GMT", 10 * time.Second, true},
		{"99999999999999999999", 0, false},
		{"99999999999", 24 * time.Hour, true},
	} {
		got, ok := retryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestTransportDelayBounds(t *testing.T) {
	tr := NewTransport(WithBaseDelay(100*time.Millisecond), WithMaxDelay(time.Second))
	for i := 0; i < 200; i++ {
		for attempt, ceiling := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 30: time.Second} {
			if d := tr.delay(attempt, 0, false); d < 0 || d > ceiling {
				t.Fatalf("delay(attempt %d) = %v, want in [0, %v]", attempt, d, ceiling)
			}
		}
		if d := tr.delay(1, 500*time.Millisecond, true); d < 500*time.Millisecond || d > 600*time.Millisecond {
			t.Fatalf("hinted delay %v, want in [500ms, 600ms]", d)
		}
		if d := tr.delay(1, time.Hour, true); d != time.Second {
			t.Fatalf("hinted delay %v, want capped at 1s", d)
		}
	}
}

func TestTransportGivesUpAtDeadline(t *testing.T) {
	t.Run("hint past the deadline", func(t *testing.T) {
		rec := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) { inFlight(w, "2") })
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		resp, err := NewTransport().RoundTrip(post(t, ctx, rec.srv.URL, "b"))
		if err != nil {
			t.Fatalf("want the last response, got error %v", err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "in-flight") {
			t.Errorf("got %d %q, want the 409 in-flight response whole", resp.StatusCode, body)
		}
		if took := time.Since(start); took >= 300*time.Millisecond {
			t.Errorf("took %v: slept toward a retry that could not start before the deadline", took)
		}
		if n := len(rec.seen()); n != 1 {
			t.Errorf("%d attempts, want 1", n)
		}
	})
	t.Run("backoff until the deadline", func(t *testing.T) {
		rec := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
		ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancel()
		start := time.Now()
		tr := NewTransport(WithMaxAttempts(1000), WithBaseDelay(20*time.Millisecond), WithMaxDelay(50*time.Millisecond))
		resp, err := tr.RoundTrip(post(t, ctx, rec.srv.URL, "b"))
		took := time.Since(start)
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("error %v, want the last response or the deadline", err)
			}
		} else {
			_ = readAll(t, resp)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("status %d, want the last 503", resp.StatusCode)
			}
		}
		if took > 400*time.Millisecond+200*time.Millisecond {
			t.Errorf("took %v, want to stop at the 400ms deadline", took)
		}
		if n := len(rec.seen()); n < 3 || n >= 1000 {
			t.Errorf("%d attempts, want several, bounded by the deadline", n)
		}
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		rec := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) { inFlight(w, "") })
		ctx, cancel := context.WithCancel(context.Background())
		tr := NewTransport(WithBaseDelay(10*time.Second), WithMaxDelay(10*time.Second))
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		resp, err := tr.RoundTrip(post(t, ctx, rec.srv.URL, "b"))
		if time.Since(start) > 5*time.Second {
			t.Error("a cancelled wait did not end")
		}
		// The jittered wait may be short enough for a second attempt or
		// two; whatever came last is handed back, whole, or the cause.
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("error %v, want the last response or context.Canceled", err)
			}
			return
		}
		if body := readAll(t, resp); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "in-flight") {
			t.Errorf("got %d %q, want the last 409 whole", resp.StatusCode, body)
		}
	})
}

// onceReader hides bytes.Reader from http.NewRequest, so GetBody is nil.
type onceReader struct{ r io.Reader }

func (o *onceReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestTransportBuffersBodyWithoutGetBody(t *testing.T) {
	const body = `{"amount":1000,"currency":"JPY","to":"alice"}`
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n < 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		created(w)
	})
	req, err := http.NewRequest(http.MethodPost, rec.srv.URL, &onceReader{strings.NewReader(body)})
	if err != nil {
		t.Fatal(err)
	}
	if req.GetBody != nil {
		t.Fatal("test setup: GetBody should be nil")
	}
	resp, err := fast().RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	assertSameKeyAndBody(t, rec.seen(), 3, body)
}

func TestTransportSendsOversizedBodyOnce(t *testing.T) {
	body := strings.Repeat("x", 100)
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	req, _ := http.NewRequest(http.MethodPost, rec.srv.URL, &onceReader{strings.NewReader(body)})
	resp, err := fast(WithMaxBufferBytes(10)).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	assertSameKeyAndBody(t, rec.seen(), 1, body)
}

func TestTransportMethods(t *testing.T) {
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	tr := fast()
	do := func(method string) []attempt {
		before := len(rec.seen())
		req, _ := http.NewRequest(method, rec.srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = readAll(t, resp)
		return rec.seen()[before:]
	}
	for _, m := range []string{http.MethodPatch, http.MethodPost} {
		seen := do(m)
		if len(seen) != 2 || seen[0].key == "" || seen[0].key != seen[1].key {
			t.Errorf("%s: %+v, want two attempts with one generated key", m, seen)
		}
	}
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		seen := do(m)
		if len(seen) != 2 || seen[0].key != "" {
			t.Errorf("%s: %+v, want two attempts (idempotent method) without a key", m, seen)
		}
	}
	// A non-idempotent method without a key is never repeated.
	rec2 := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	req, _ := http.NewRequest("CHARGE", rec2.srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, resp)
	if seen := rec2.seen(); len(seen) != 1 || seen[0].key != "" {
		t.Errorf("CHARGE: %+v, want one attempt without a key", seen)
	}
}

// closeTracker records whether each response body handed out was closed.
type closeTracker struct {
	base   http.RoundTripper
	mu     sync.Mutex
	bodies []*trackedBody
}

type trackedBody struct {
	io.ReadCloser
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return b.ReadCloser.Close() }

func (c *closeTracker) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if err == nil {
		tb := &trackedBody{ReadCloser: resp.Body}
		resp.Body = tb
		c.mu.Lock()
		c.bodies = append(c.bodies, tb)
		c.mu.Unlock()
	}
	return resp, err
}

func TestTransportClosesRetriedBodies(t *testing.T) {
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 0:
			inFlight(w, "0")
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write(bytes.Repeat([]byte("e"), 200<<10)) // bigger than the drain limit
		default:
			created(w)
		}
	})
	ct := &closeTracker{base: http.DefaultTransport}
	resp, err := fast(WithBase(ct)).RoundTrip(post(t, context.Background(), rec.srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ct.bodies) != 3 {
		t.Fatalf("%d responses, want 3", len(ct.bodies))
	}
	for i, b := range ct.bodies[:2] {
		if !b.closed.Load() {
			t.Errorf("retried response %d was not closed", i)
		}
	}
	if ct.bodies[2].closed.Load() {
		t.Error("the final response was closed before the caller read it")
	}
	_ = readAll(t, resp)
}

func TestTransportZeroValueAndNilOptions(t *testing.T) {
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) { created(w) })
	for name, tr := range map[string]*Transport{
		"zero":        {},
		"nil options": NewTransport(nil, WithBase(nil), WithKeyFunc(nil), WithKeyHeader(""), nil),
	} {
		resp, err := tr.RoundTrip(post(t, context.Background(), rec.srv.URL, "b"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_ = readAll(t, resp)
	}
	for i, a := range rec.seen() {
		if !uuidV4.MatchString(a.key) {
			t.Errorf("request %d key %q, want a generated UUIDv4", i, a.key)
		}
	}
	if _, err := (&Transport{}).RoundTrip(nil); err == nil {
		t.Error("nil request: want an error")
	}
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		k, err := NewKey()
		if err != nil {
			t.Fatal(err)
		}
		if !uuidV4.MatchString(k) {
			t.Fatalf("%q is not a UUIDv4", k)
		}
		if seen[k] {
			t.Fatalf("duplicate key %q", k)
		}
		seen[k] = true
	}
}
