package nethttpidem

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Transport defaults.
const (
	// DefaultMaxAttempts is how many times Transport sends a request at most.
	DefaultMaxAttempts = 5
	// DefaultBaseDelay is the backoff ceiling of the first retry.
	DefaultBaseDelay = 100 * time.Millisecond
	// DefaultMaxDelay caps every wait, Retry-After hints included.
	DefaultMaxDelay = 5 * time.Second
	// DefaultMaxBufferBytes is the largest body Transport buffers to resend
	// when the request has no GetBody.
	DefaultMaxBufferBytes = 1 << 20
)

// drainLimit bounds how much of a retried response's body is read (and
// kept, so it can still be returned if the wait is cut short) before it is
// closed; a longer body is discarded and its connection closed.
const drainLimit = 64 << 10

// TransportOption configures a Transport. Options follow the
// OpenTelemetry-contrib style: a nil TransportOption is ignored.
type TransportOption interface{ apply(*Transport) }

type transportOptionFunc func(*Transport)

func (f transportOptionFunc) apply(t *Transport) {
	if f != nil {
		f(t)
	}
}

// WithBase sets the RoundTripper that sends each attempt. A nil base is
// ignored. Default: http.DefaultTransport.
func WithBase(rt http.RoundTripper) TransportOption {
	return transportOptionFunc(func(t *Transport) {
		if rt != nil {
			t.base = rt
		}
	})
}

// WithMaxAttempts sets how many times a request is sent at most, the first
// attempt included; values below 1 mean 1 (no retry).
// Default: DefaultMaxAttempts (5).
func WithMaxAttempts(n int) TransportOption {
	return transportOptionFunc(func(t *Transport) { t.maxAttempts = max(n, 1) })
}

// WithBaseDelay sets the backoff ceiling of the first retry; it doubles at
// each retry up to the max delay, and the actual wait is drawn uniformly
// below it ("full jitter"). Negative values mean 0.
// Default: DefaultBaseDelay (100ms).
func WithBaseDelay(d time.Duration) TransportOption {
	return transportOptionFunc(func(t *Transport) { t.baseDelay = max(d, 0) })
}

// WithMaxDelay caps every wait between attempts, including a server's
// Retry-After hint: a hint longer than the cap is shortened to it. Negative
// values mean 0. Default: DefaultMaxDelay (5s).
func WithMaxDelay(d time.Duration) TransportOption {
	return transportOptionFunc(func(t *Transport) { t.maxDelay = max(d, 0) })
}

// WithKeyHeader sets the header carrying the idempotency key. An empty name
// is ignored. Default: "Idempotency-Key".
func WithKeyHeader(name string) TransportOption {
	return transportOptionFunc(func(t *Transport) {
		if name != "" {
			t.header = http.CanonicalHeaderKey(name)
		}
	})
}

// WithKeyFunc sets how a key is made for a request that has none. It is
// called once per RoundTrip, never per attempt; an error (or an empty key)
// fails the RoundTrip before anything is sent. A nil function is ignored.
// Default: NewKey, a random UUIDv4 from crypto/rand.
func WithKeyFunc(f func(*http.Request) (string, error)) TransportOption {
	return transportOptionFunc(func(t *Transport) {
		if f != nil {
			t.keyFunc = f
		}
	})
}

// WithKeyMethods sets the methods that get a key when they have none.
// Requests of other methods are sent with their headers untouched.
// Default: POST, PATCH.
func WithKeyMethods(methods ...string) TransportOption {
	return transportOptionFunc(func(t *Transport) {
		t.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			t.methods[strings.ToUpper(m)] = true
		}
	})
}

// WithMaxBufferBytes sets the largest request body Transport buffers in
// memory so it can resend it, for requests whose GetBody is nil (requests
// built by http.NewRequest from a *bytes.Buffer, *bytes.Reader or
// *strings.Reader have one and are never buffered). A body larger than this
// is streamed once and the request is not retried. Values below 0 mean 0.
// Default: DefaultMaxBufferBytes (1 MiB).
func WithMaxBufferBytes(n int64) TransportOption {
	return transportOptionFunc(func(t *Transport) { t.maxBuffer = max(n, 0) })
}

// Transport is the client side of idem: an http.RoundTripper that makes
// retrying a non-idempotent request safe.
//
//   - It adds an Idempotency-Key to POST and PATCH requests that have none
//     (see WithKeyMethods, WithKeyFunc) and sends the same key on every
//     attempt; a key already on the request is kept.
//   - It retries network failures (connection refused, reset or aborted,
//     EOF before a response, timeouts other than the context's), 409
//     Conflict (plain, or idem's in-flight problem; a 409 problem of any
//     other type, such as not-retained, is final), 429, 502, 503 and 504.
//     It never retries any other status: 422 and other 4xx are final.
//   - It waits with exponential backoff and full jitter between attempts,
//     or at least the server's Retry-After (seconds or HTTP-date), capped
//     by the max delay.
//   - It resends the body from req.GetBody, or, when GetBody is nil, from a
//     copy buffered in memory up to WithMaxBufferBytes (a larger body is
//     sent once, without retries).
//   - It stops after the max attempts, and never sleeps past the context's
//     deadline: when the next wait would end after it, it returns the last
//     response (or error) at once. A context cancelled during a wait
//     returns the last response if its body was read whole, else the
//     context's error.
//   - The bodies of responses it retries are read (up to 64 KiB) and closed.
//
// Only requests that are safe to repeat are retried: those carrying the key
// header (added or kept) and those whose method is idempotent (GET, HEAD,
// OPTIONS, TRACE, PUT, DELETE). Anything else is sent once.
//
// A Transport is safe for concurrent use. Build it with NewTransport; the
// zero value also works and uses the defaults.
type Transport struct {
	base        http.RoundTripper
	maxAttempts int
	baseDelay   time.Duration
	maxDelay    time.Duration
	header      string
	keyFunc     func(*http.Request) (string, error)
	methods     map[string]bool
	maxBuffer   int64
	configured  bool
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport configured by opts.
func NewTransport(opts ...TransportOption) *Transport {
	t := &Transport{}
	t.setDefaults()
	for _, o := range opts {
		if o != nil {
			o.apply(t)
		}
	}
	return t
}

func (t *Transport) setDefaults() {
	t.base = http.DefaultTransport
	t.maxAttempts = DefaultMaxAttempts
	t.baseDelay = DefaultBaseDelay
	t.maxDelay = DefaultMaxDelay
	t.header = "Idempotency-Key"
	t.keyFunc = func(*http.Request) (string, error) { return NewKey() }
	t.methods = map[string]bool{http.MethodPost: true, http.MethodPatch: true}
	t.maxBuffer = DefaultMaxBufferBytes
	t.configured = true
}

// settings returns t, or a defaulted copy for a zero Transport.
func (t *Transport) settings() *Transport {
	if t.configured {
		return t
	}
	d := &Transport{}
	d.setDefaults()
	return d
}

// NewKey returns a random key in UUIDv4 format, from crypto/rand.
func NewKey() (string, error) {
	var b [16]byte
	if _, err := crand.Read(b[:]); err != nil {
		return "", fmt.Errorf("nethttpidem: generate key: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:]), nil
}

// CloseIdleConnections closes the base transport's idle connections, if it
// has any (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if c, ok := t.settings().base.(closeIdler); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip implements http.RoundTripper. It does not modify req: each
// attempt sends a clone carrying the key.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	cfg := t.settings()
	if req == nil || req.URL == nil {
		closeBody(req)
		return nil, errors.New("nethttpidem: nil request or URL")
	}
	ctx := req.Context()
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}

	out := req.Clone(ctx)
	keyed := len(out.Header.Values(cfg.header)) > 0
	if !keyed && cfg.methods[method] {
		key, err := cfg.keyFunc(req)
		if err == nil && key == "" {
			err = errors.New("empty key")
		}
		if err != nil {
			closeBody(req)
			return nil, fmt.Errorf("nethttpidem: idempotency key: %w", err)
		}
		out.Header.Set(cfg.header, key)
		keyed = true
	}
	retryable := keyed || idempotentMethod(method)
	attempts := cfg.maxAttempts
	if !retryable {
		attempts = 1
	}

	// Make the body resendable.
	hasBody := req.Body != nil && req.Body != http.NoBody
	if hasBody && attempts > 1 && req.GetBody == nil {
		buf, err := io.ReadAll(io.LimitReader(req.Body, cfg.maxBuffer+1))
		if err != nil {
			closeBody(req)
			return nil, fmt.Errorf("nethttpidem: read request body: %w", err)
		}
		if int64(len(buf)) > cfg.maxBuffer {
			// Too large to keep: send it once, streaming the rest.
			out.Body = readCloser{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}
			attempts = 1
		} else {
			_ = req.Body.Close()
			out.ContentLength = int64(len(buf))
			out.Body = io.NopCloser(bytes.NewReader(buf))
			out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
		}
	}

	var (
		resp *http.Response
		err  error
	)
	for attempt := 1; ; attempt++ {
		if attempt > 1 && hasBody {
			body, gerr := out.GetBody()
			if gerr != nil {
				return nil, fmt.Errorf("nethttpidem: rewind request body: %w", gerr)
			}
			next := out.WithContext(ctx) // shallow copy; the header is shared, read-only
			next.Body = body
			resp, err = cfg.base.RoundTrip(next)
		} else {
			resp, err = cfg.base.RoundTrip(out)
		}
		if attempt >= attempts || ctx.Err() != nil {
			return resp, err
		}
		var hint time.Duration
		var hinted bool
		if err != nil {
			if !retryableError(err) {
				return resp, err
			}
		} else {
			retry, peeked := retryableResponse(resp)
			if peeked != nil {
				resp.Body = peeked
			}
			if !retry {
				return resp, nil
			}
			hint, hinted = retryAfter(resp.Header.Get("Retry-After"), time.Now())
		}
		delay := cfg.delay(attempt, hint, hinted)
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(delay).After(dl) {
			// The next attempt could not start before the deadline.
			return resp, err
		}
		whole := false
		if resp != nil {
			resp, whole = drain(resp)
		}
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			if whole {
				return resp, nil
			}
			if err == nil {
				err = fmt.Errorf("nethttpidem: %w", context.Cause(ctx))
			}
			return nil, err
		}
		if resp != nil {
			_ = resp.Body.Close()
		}
	}
}

// delay returns the wait before attempt+1: at least the Retry-After hint
// (plus up to one base delay of jitter, so clients told the same hint do not
// return in lockstep), else full-jitter exponential backoff; capped by the
// max delay either way.
func (t *Transport) delay(attempt int, hint time.Duration, hinted bool) time.Duration {
	if hinted {
		return min(hint+jitter(t.baseDelay), t.maxDelay)
	}
	ceiling := t.baseDelay
	for i := 1; i < attempt && ceiling < t.maxDelay; i++ {
		ceiling *= 2
	}
	return jitter(min(ceiling, t.maxDelay))
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

// retryAfter parses a Retry-After value: delay-seconds or an HTTP-date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		if secs > int64(24*time.Hour/time.Second) {
			secs = int64(24 * time.Hour / time.Second) // avoid overflow; capped later anyway
		}
		return time.Duration(secs) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

func idempotentMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// retryableError reports whether err is a transient network failure, after
// which the request may be sent again.
func retryableError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, target := range []error{
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true // nothing was sent
	}
	// net/http's own "server closed idle connection" error wraps nothing.
	return strings.Contains(err.Error(), "server closed idle connection")
}

// problemPeek bounds how much of a 409 body is read to find its problem type.
const problemPeek = 4 << 10

// retryableResponse reports whether resp's status is worth another attempt.
// For a 409 problem+json it reads the start of the body to find the problem
// type; peeked then replaces resp.Body (it yields the same bytes).
func retryableResponse(resp *http.Response) (retry bool, peeked io.ReadCloser) {
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true, nil
	case http.StatusConflict:
	default:
		return false, nil
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/problem+json" || resp.Body == nil {
		return true, nil // a plain 409
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, problemPeek))
	peeked = readCloser{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	if err != nil {
		return false, peeked
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(head, &p) != nil || p.Type == "" || p.Type == "about:blank" {
		return true, peeked // no problem type: a plain 409
	}
	// idem's in-flight problem, under any base URI. Other conflicts
	// (not-retained, domain conflicts) will not change on retry.
	return strings.HasSuffix(p.Type, "/in-flight") || p.Type == "in-flight", peeked
}

// drain reads up to drainLimit of resp's body and closes it, so its
// connection can be reused. whole reports that the body was read entirely:
// the returned response then carries it in memory and may still be handed
// to the caller.
func drain(resp *http.Response) (*http.Response, bool) {
	if resp.Body == nil {
		return resp, true
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, drainLimit+1))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, err == nil && len(body) <= drainLimit
}

func closeBody(req *http.Request) {
	if req != nil && req.Body != nil {
		_ = req.Body.Close()
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}
