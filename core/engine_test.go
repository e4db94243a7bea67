package core_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

const payBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

func newEngine(t *testing.T, s core.Store, opts ...core.Option) *core.Engine {
	t.Helper()
	eng, err := core.New(s, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	require.NoError(t, err)
	return eng
}

// request builds a POST /pay with key (no header if empty) and body.
func request(key, body string) core.Request {
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return core.Request{Method: http.MethodPost, Route: "/pay", Header: h, Body: strings.NewReader(body)}
}

func decide(t *testing.T, eng *core.Engine, req core.Request) *core.Decision {
	t.Helper()
	d, err := eng.Decide(context.Background(), req)
	require.NoError(t, err)
	require.NotNil(t, d)
	return d
}

// pollDecide is decide for an Eventually condition, which testify runs on a
// goroutine of its own where require (t.FailNow) must not be called: a
// failure is reported with assert and gives a nil decision, on which the
// condition should stop polling and the test then require a decision.
func pollDecide(t *testing.T, eng *core.Engine, req core.Request) *core.Decision {
	t.Helper()
	d, err := eng.Decide(context.Background(), req)
	if !assert.NoError(t, err) || !assert.NotNil(t, d) {
		return nil
	}
	return d
}

// proceed decides req and requires that it owns the key.
func proceed(t *testing.T, eng *core.Engine, req core.Request) *core.Decision {
	t.Helper()
	d := decide(t, eng, req)
	require.Equal(t, core.Proceed, d.Outcome, "response: %+v", d.Response)
	// A test that leaves its owner unfinished must not leak the heartbeat
	// (TestMain runs goleak); on a finished decision this is ErrFinished.
	t.Cleanup(func() { _ = eng.Abort(context.Background(), d, nil) })
	return d
}

func created(body string) adapterkit.Response {
	return adapterkit.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/pay/1"}},
		Body:   []byte(body),
	}
}

// problemOf decodes a Reject's problem and checks its envelope.
func problemOf(t *testing.T, d *core.Decision) problem.Details {
	t.Helper()
	require.Equal(t, core.Reject, d.Outcome)
	require.NotNil(t, d.Response)
	assert.Equal(t, "application/problem+json", d.Response.Header.Get("Content-Type"))
	var p problem.Details
	require.NoError(t, json.Unmarshal(d.Response.Body, &p), "%q", d.Response.Body)
	assert.Equal(t, d.Response.Status, p.Status)
	return p
}

func requireProblem(t *testing.T, d *core.Decision, status int, name string) {
	t.Helper()
	p := problemOf(t, d)
	assert.Equal(t, status, d.Response.Status)
	assert.Equal(t, problem.BaseURI+name, p.Type)
}

// countingStore counts calls, for "the store was never asked" checks.
type countingStore struct {
	core.Store
	claims, heartbeats atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, r)
}

func (s *countingStore) Heartbeat(ctx context.Context, f storekit.Fence, d time.Duration) error {
	s.heartbeats.Add(1)
	return s.Store.Heartbeat(ctx, f, d)
}

// faultStore overrides store methods for fault injection.
type faultStore struct {
	core.Store
	claim     func(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error)
	heartbeat func(ctx context.Context, f storekit.Fence, d time.Duration) error
}

func (s *faultStore) Claim(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
	if s.claim != nil {
		return s.claim(ctx, r)
	}
	return s.Store.Claim(ctx, r)
}

func (s *faultStore) Heartbeat(ctx context.Context, f storekit.Fence, d time.Duration) error {
	if s.heartbeat != nil {
		return s.heartbeat(ctx, f, d)
	}
	return s.Store.Heartbeat(ctx, f, d)
}

func TestNewValidatesOptions(t *testing.T) {
	s := memstore.New()
	bad := map[string]core.Option{
		"empty header":          core.WithHeader(""),
		"header with space":     core.WithHeader("Idempotency Key"),
		"no methods":            core.WithMethods(),
		"safe method":           core.WithMethods("POST", "get"),
		"short lease":           core.WithLease(50 * time.Millisecond),
		"retention <= lease":    core.WithRetention(10 * time.Second),
		"zero request limit":    core.WithMaxRequestBytes(0),
		"negative resp limit":   core.WithMaxResponseBytes(-1),
		"nil policy":            core.WithRetryable(nil),
		"nil scope":             core.WithScope(nil),
		"set-cookie replayed":   core.WithReplayHeaders("Content-Type", "set-cookie"),
		"date replayed":         core.WithReplayHeaders("Date"),
		"negative wait":         core.WithWait(-time.Second),
		"zero wait poll":        core.WithWaitPoll(0),
		"nil clock":             core.WithClock(nil),
		"nil logger":            core.WithLogger(nil),
		"zero commit timeout":   core.WithCommitTimeout(0),
		"hop-by-hop replayed":   core.WithReplayHeaders("Transfer-Encoding"),
		"connection replayed":   core.WithReplayHeaders("Connection"),
		"authorization replay":  core.WithReplayHeaders("WWW-Authenticate"),
		"replayed-hdr replayed": core.WithReplayHeaders("Idempotent-Replayed"),
	}
	for name, opt := range bad {
		t.Run(name, func(t *testing.T) {
			var eng *core.Engine
			var err error
			require.NotPanics(t, func() { eng, err = core.New(s, opt) })
			assert.Error(t, err)
			assert.Nil(t, eng)
		})
	}

	t.Run("every bad option is listed", func(t *testing.T) {
		opts := []core.Option{
			core.WithHeader("a b"), core.WithLease(time.Millisecond), core.WithMaxRequestBytes(-5),
			core.WithRetryable(nil), core.WithReplayHeaders("Set-Cookie"), core.WithWaitPoll(-1), nil,
		}
		_, err := core.New(s, opts...)
		require.Error(t, err)
		var joined interface{ Unwrap() []error }
		require.ErrorAs(t, err, &joined)
		assert.Len(t, joined.Unwrap(), 6, "one error per bad option: %v", err)
		for _, want := range []string{`"a b"`, "1ms", "-5", "policy", "Set-Cookie", "poll"} {
			assert.Contains(t, err.Error(), want)
		}
	})

	t.Run("nil store", func(t *testing.T) {
		eng, err := core.New(nil)
		assert.Error(t, err)
		assert.Nil(t, eng)
	})

	t.Run("nil options are ignored", func(t *testing.T) {
		eng, err := core.New(s, nil, core.WithLease(time.Second), nil)
		require.NoError(t, err)
		require.NotNil(t, eng)
	})

	t.Run("valid non-defaults", func(t *testing.T) {
		_, err := core.New(s,
			core.WithHeader("X-Request-Key"), core.WithKeyRequired(false), core.WithMethods("post", "PUT", "DELETE"),
			core.WithLease(100*time.Millisecond), core.WithRetention(time.Second), core.WithMaxRequestBytes(1),
			core.WithMaxResponseBytes(0), core.WithReplayHeaders("content-type", "X-Custom"),
			core.WithFingerprintHeaders("Accept"), core.WithCanonicalJSON(true), core.WithWait(time.Second),
			core.WithWaitPoll(time.Millisecond), core.WithClock(time.Now), core.WithLogger(slog.Default()),
			core.WithObserver(func(core.Event) {}), core.WithCommitTimeout(time.Second))
		require.NoError(t, err)
	})
}

func TestDecideBypass(t *testing.T) {
	eng := newEngine(t, memstore.New())
	for _, m := range []string{"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE", "get"} {
		// Even an invalid key is ignored on methods idem does not protect.
		req := request(strings.Repeat("x", 300), payBody)
		req.Method = m
		d := decide(t, eng, req)
		assert.Equal(t, core.Bypass, d.Outcome, m)
		assert.False(t, d.BodyRead, "%s: body must be left to the handler", m)
	}
	req := request("k", payBody)
	req.Method = "patch"
	proceed(t, eng, req) // PATCH is protected by default
}

func TestDecideMissingKey(t *testing.T) {
	s := &countingStore{Store: memstore.New()}
	d := decide(t, newEngine(t, s), request("", payBody))
	requireProblem(t, d, http.StatusBadRequest, problem.MissingKey)

	d = decide(t, newEngine(t, s, core.WithKeyRequired(false)), request("", payBody))
	assert.Equal(t, core.Bypass, d.Outcome)
	assert.Zero(t, s.claims.Load())
}

// readTracker records whether the body was read.
type readTracker struct {
	r    io.Reader
	read atomic.Bool
}

func (r *readTracker) Read(p []byte) (int, error) { r.read.Store(true); return r.r.Read(p) }

func TestDecideInvalidKey(t *testing.T) {
	s := &countingStore{Store: memstore.New()}
	eng := newEngine(t, s)
	for name, vals := range map[string][]string{
		"256 bytes":   {strings.Repeat("a", 256)},
		"control":     {"ab\x01c"},
		"tab inside":  {"ab\tc"},
		"two lines":   {"a", "b"},
		"empty":       {""},
		"non-ascii":   {"kéy"},
		"list":        {`"a", "b"`},
		"param":       {`"a";p=1`},
		"quote inner": {`a"b`},
	} {
		t.Run(name, func(t *testing.T) {
			body := &readTracker{r: strings.NewReader(payBody)}
			req := core.Request{Method: "POST", Route: "/pay", Header: http.Header{"Idempotency-Key": vals}, Body: body}
			d := decide(t, eng, req)
			requireProblem(t, d, http.StatusBadRequest, problem.InvalidKey)
			assert.False(t, body.read.Load(), "an invalid key must be refused before the body is read")
		})
	}
	assert.Zero(t, s.claims.Load())

	t.Run("custom header", func(t *testing.T) {
		eng := newEngine(t, s, core.WithHeader("x-request-key"))
		req := request("", payBody)
		req.Header.Set("X-Request-Key", "abc")
		d := decide(t, eng, req)
		assert.Equal(t, core.Proceed, d.Outcome)
		assert.Equal(t, "abc", d.Key)
		require.NoError(t, eng.Abort(context.Background(), d, nil))
	})
}

func TestDecideBodyTooLarge(t *testing.T) {
	s := &countingStore{Store: memstore.New()}
	eng := newEngine(t, s, core.WithMaxRequestBytes(10))
	requireProblem(t, decide(t, eng, request("k", "01234567890")), http.StatusRequestEntityTooLarge, problem.BodyTooLarge)
	assert.Zero(t, s.claims.Load(), "nothing is claimed for a refused body")
	d := proceed(t, eng, request("k", "0123456789"))
	assert.Equal(t, []byte("0123456789"), d.Body)
	assert.True(t, d.BodyRead)
	require.NoError(t, eng.Abort(context.Background(), d, nil))
}

// TestDecideBodyBytes: a body the framework already holds (fasthttp) is
// hashed in place, with the same fingerprint and limit as a streamed one,
// and Decide keeps no reference to it.
func TestDecideBodyBytes(t *testing.T) {
	s := &countingStore{Store: memstore.New()}
	eng := newEngine(t, s, core.WithMaxRequestBytes(10))
	over := request("k", "")
	over.Body = adapterkit.BodyBytes(func() []byte { return []byte("01234567890") })
	requireProblem(t, decide(t, eng, over), http.StatusRequestEntityTooLarge, problem.BodyTooLarge)
	assert.Zero(t, s.claims.Load(), "nothing is claimed for a refused body")

	buf := []byte("0123456789")
	req := request("k", "")
	req.Body = adapterkit.BodyBytes(func() []byte { return buf })
	d := proceed(t, eng, req)
	assert.Nil(t, d.Body, "the framework gives the handler its body")
	assert.False(t, d.BodyRead, "Body was not read")
	_, err := req.Body.Read(make([]byte, 1))
	assert.Error(t, err, "a BodyBytes is called, not read")
	copy(buf, "XXXXXXXXXX") // the framework reuses its buffer
	require.NoError(t, eng.Commit(context.Background(), d, created(`{}`)))

	// The same request as a stream replays: the fingerprint was of the
	// bytes, not of the reader, and not changed by the reuse.
	again := decide(t, eng, request("k", "0123456789"))
	assert.Equal(t, core.Replay, again.Outcome)
	other := request("k", "")
	other.Body = adapterkit.BodyBytes(func() []byte { return []byte("XXXXXXXXXX") })
	requireProblem(t, decide(t, eng, other), http.StatusUnprocessableEntity, problem.PayloadMismatch)
}

type brokenBody struct{}

func (brokenBody) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestDecideBodyUnreadable(t *testing.T) {
	s := &countingStore{Store: memstore.New()}
	req := request("k", "")
	req.Body = brokenBody{}
	requireProblem(t, decide(t, newEngine(t, s), req), http.StatusBadRequest, problem.BodyUnreadable)
	assert.Zero(t, s.claims.Load())
}

func TestDecideNilBody(t *testing.T) {
	eng := newEngine(t, memstore.New())
	req := request("k", "")
	req.Body = nil
	d := proceed(t, eng, req)
	assert.NotNil(t, d.Body)
	assert.Empty(t, d.Body)
	require.NoError(t, eng.Commit(context.Background(), d, created("")))
	// http.NoBody and an empty reader fingerprint like a nil body.
	req.Body = http.NoBody
	assert.Equal(t, core.Replay, decide(t, eng, req).Outcome)
	assert.Equal(t, core.Replay, decide(t, eng, request("k", "")).Outcome)
}

// Payload mismatch is answered 422 before any state check, even while the
// first request is in flight.
func TestDecideMismatchBeforeInFlight(t *testing.T) {
	eng := newEngine(t, memstore.New())
	first := proceed(t, eng, request("k", payBody))

	requireProblem(t, decide(t, eng, request("k", `{"amount":50000}`)), http.StatusUnprocessableEntity, problem.PayloadMismatch)
	other := request("k", payBody)
	other.Route = "/refund"
	requireProblem(t, decide(t, eng, other), http.StatusUnprocessableEntity, problem.PayloadMismatch)
	other = request("k", payBody)
	other.Method = "PATCH"
	requireProblem(t, decide(t, eng, other), http.StatusUnprocessableEntity, problem.PayloadMismatch)

	// The identical request, meanwhile, is in flight.
	d := decide(t, eng, request("k", payBody))
	requireProblem(t, d, http.StatusConflict, problem.InFlight)
	assert.Equal(t, "1", d.Response.Header.Get("Retry-After"), "Retry-After is the WithRetryAfter hint (default 1s)")

	require.NoError(t, eng.Commit(context.Background(), first, created(`{"id":1}`)))
	requireProblem(t, decide(t, eng, request("k", `{"amount":50000}`)), http.StatusUnprocessableEntity, problem.PayloadMismatch)
}

func TestDecideScope(t *testing.T) {
	s := memstore.New()
	t.Run("isolation", func(t *testing.T) {
		eng := newEngine(t, s)
		a := request("shared", payBody)
		a.Scope = "tenant-a"
		b := request("shared", `{"other":true}`)
		b.Scope = "tenant-b"
		da := proceed(t, eng, a)
		db := proceed(t, eng, b)
		assert.Equal(t, "tenant-a", da.Scope)
		assert.Equal(t, "tenant-b", db.Scope)
		require.NoError(t, eng.Commit(context.Background(), da, created("A")))
		require.NoError(t, eng.Commit(context.Background(), db, created("B")))
		a.Body, b.Body = strings.NewReader(payBody), strings.NewReader(`{"other":true}`)
		assert.Equal(t, []byte("A"), decide(t, eng, a).Response.Body)
		assert.Equal(t, []byte("B"), decide(t, eng, b).Response.Body)
	})
	t.Run("ScopeFunc", func(t *testing.T) {
		eng := newEngine(t, s)
		req := request("sf", payBody)
		req.Scope = "ignored"
		req.ScopeFunc = func(context.Context, *core.Request) (string, error) { return "from-func", nil }
		d := proceed(t, eng, req)
		assert.Equal(t, "from-func", d.Scope)
		require.NoError(t, eng.Abort(context.Background(), d, nil))
	})
	t.Run("WithScope", func(t *testing.T) {
		eng := newEngine(t, s, core.WithScope(func(_ context.Context, r *core.Request) (string, error) {
			return "opt-" + r.Header.Get("X-User"), nil
		}))
		req := request("ws", payBody)
		req.Header.Set("X-User", "u1")
		req.ScopeFunc = func(context.Context, *core.Request) (string, error) { return "adapter", nil }
		d := proceed(t, eng, req)
		assert.Equal(t, "opt-u1", d.Scope)
		require.NoError(t, eng.Abort(context.Background(), d, nil))
	})
	t.Run("error is 401", func(t *testing.T) {
		s := &countingStore{Store: s}
		eng := newEngine(t, s)
		req := request("k", payBody)
		req.ScopeFunc = func(context.Context, *core.Request) (string, error) { return "", errors.New("no auth") }
		requireProblem(t, decide(t, eng, req), http.StatusUnauthorized, problem.ScopeUnavailable)
		assert.Zero(t, s.claims.Load())
	})
}

func TestDecideStoreDown(t *testing.T) {
	down := errors.New("connection refused")
	eng := newEngine(t, &faultStore{Store: memstore.New(), claim: func(context.Context, storekit.ClaimRequest) (storekit.ClaimResult, error) {
		return storekit.ClaimResult{}, down
	}})
	d, err := eng.Decide(context.Background(), request("k", payBody))
	require.ErrorIs(t, err, down)
	require.NotNil(t, d)
	requireProblem(t, d, http.StatusServiceUnavailable, problem.StoreUnavailable)
	assert.Equal(t, "1", d.Response.Header.Get("Retry-After"))
	assert.ErrorIs(t, eng.Commit(context.Background(), d, created("x")), core.ErrNotOwner)
}

func TestReplay(t *testing.T) {
	eng := newEngine(t, memstore.New())
	d := proceed(t, eng, request("k", payBody))
	resp := created(`{"id":"pay_1"}`)
	resp.Header.Add("Link", "</a>; rel=a")
	resp.Header.Add("Link", "</b>; rel=b")
	resp.Header.Set("Set-Cookie", "s=1")
	resp.Header.Set("Date", "Mon, 01 Jan 2001 00:00:00 GMT")
	resp.Header.Set("X-Request-Id", "r1")
	resp.Header.Set("Connection", "close")
	require.NoError(t, eng.Commit(context.Background(), d, resp))
	// The caller reusing its buffer must not change the stored response.
	copy(resp.Body, "XXXXXXXXXXXXXX")
	resp.Header.Set("Location", "/changed")

	for range 2 {
		r := decide(t, eng, request("k", payBody))
		require.Equal(t, core.Replay, r.Outcome)
		assert.Equal(t, http.StatusCreated, r.Response.Status)
		assert.Equal(t, `{"id":"pay_1"}`, string(r.Response.Body))
		assert.Equal(t, http.Header{
			"Content-Type":        {"application/json"},
			"Location":            {"/pay/1"},
			"Link":                {"</a>; rel=a", "</b>; rel=b"},
			"Idempotent-Replayed": {"true"},
		}, r.Response.Header)
		assert.Equal(t, "k", r.Key)
		// Each replay's header map is its own (the body is shared and
		// read-only, see Decision.Response).
		r.Response.Header.Set("Location", "/mutated")
		r.Response.Header["Link"] = append(r.Response.Header["Link"], "</c>; rel=c")
	}
}

// Headers a handler put in the map under a non-canonical key go out to the
// client as written, so the replay must keep them too.
func TestReplayNonCanonicalHeaderKeys(t *testing.T) {
	eng := newEngine(t, memstore.New())
	d := proceed(t, eng, request("k", payBody))
	require.NoError(t, eng.Commit(context.Background(), d, adapterkit.Response{Status: 201, Body: []byte("b"), Header: http.Header{
		"content-type": {"application/json"},
		"Link":         {"</a>"},
		"link":         {"</b>"},
		"set-cookie":   {"s=1"},
		"x-other":      {"1"},
	}}))
	r := decide(t, eng, request("k", payBody))
	require.Equal(t, core.Replay, r.Outcome)
	assert.Equal(t, http.Header{
		"Content-Type":        {"application/json"},
		"Link":                {"</a>", "</b>"},
		"Idempotent-Replayed": {"true"},
	}, r.Response.Header)
}

func TestReplayHeadersOption(t *testing.T) {
	eng := newEngine(t, memstore.New(), core.WithReplayHeaders("x-custom"))
	d := proceed(t, eng, request("k", payBody))
	resp := created("{}")
	resp.Header.Set("X-Custom", "1")
	require.NoError(t, eng.Commit(context.Background(), d, resp))
	r := decide(t, eng, request("k", payBody))
	assert.Equal(t, "1", r.Response.Header.Get("X-Custom"))
	assert.Empty(t, r.Response.Header.Get("Content-Type"), "not in the replaced allow-list")
}

func TestRetryableStatusesRunAgainFinalOnesReplay(t *testing.T) {
	for status, retryable := range map[int]bool{
		200: false, 201: false, 204: false, 302: false, 400: false, 404: false, 422: false,
		408: true, 409: true, 425: true, 429: true,
		500: true, 502: true, 503: true, 100: true, 0: true,
	} {
		assert.Equal(t, retryable, core.DefaultRetryable(status), "status %d", status)
	}

	eng := newEngine(t, memstore.New())
	for _, status := range []int{500, 503, 429, 409} {
		key := "k" + strconv.Itoa(status)
		d := proceed(t, eng, request(key, payBody))
		require.NoError(t, eng.Commit(context.Background(), d, adapterkit.Response{Status: status, Body: []byte("nope")}))
		d = proceed(t, eng, request(key, payBody)) // retryable: runs again
		require.NoError(t, eng.Commit(context.Background(), d, created("ok")))
		assert.Equal(t, core.Replay, decide(t, eng, request(key, payBody)).Outcome)
	}
	d := proceed(t, eng, request("k400", payBody))
	require.NoError(t, eng.Commit(context.Background(), d, adapterkit.Response{Status: 400, Body: []byte("bad")}))
	r := decide(t, eng, request("k400", payBody))
	require.Equal(t, core.Replay, r.Outcome, "a 400 is final")
	assert.Equal(t, 400, r.Response.Status)

	custom := newEngine(t, memstore.New(), core.WithRetryable(func(status int) bool {
		return status == 402 || core.DefaultRetryable(status)
	}))
	d = proceed(t, custom, request("k", payBody))
	require.NoError(t, custom.Commit(context.Background(), d, adapterkit.Response{Status: 402}))
	d = proceed(t, custom, request("k", payBody))
	require.NoError(t, custom.Abort(context.Background(), d, nil))
}

func TestCommitEmptyResponse(t *testing.T) {
	eng := newEngine(t, memstore.New())
	d := proceed(t, eng, request("k", payBody))
	require.NoError(t, eng.Commit(context.Background(), d, adapterkit.Response{}))
	r := decide(t, eng, request("k", payBody))
	require.Equal(t, core.Replay, r.Outcome)
	assert.Equal(t, http.StatusOK, r.Response.Status)
	assert.Empty(t, r.Response.Body)
}

func TestNotRetained(t *testing.T) {
	eng := newEngine(t, memstore.New())
	for name, resp := range map[string]adapterkit.Response{
		"streamed":  {Status: 200, Body: []byte("partial"), Streamed: true},
		"truncated": {Status: 201, Body: []byte("head"), Truncated: true},
	} {
		t.Run(name, func(t *testing.T) {
			d := proceed(t, eng, request(name, payBody))
			require.NoError(t, eng.Commit(context.Background(), d, resp))
			r := decide(t, eng, request(name, payBody))
			requireProblem(t, r, http.StatusConflict, problem.NotRetained)
			assert.Contains(t, problemOf(t, r).Detail, strconv.Itoa(resp.Status))
		})
	}
	t.Run("streamed 5xx stays retryable", func(t *testing.T) {
		d := proceed(t, eng, request("s5", payBody))
		require.NoError(t, eng.Commit(context.Background(), d, adapterkit.Response{Status: 502, Streamed: true}))
		d = proceed(t, eng, request("s5", payBody))
		require.NoError(t, eng.Abort(context.Background(), d, nil))
	})
}

func TestCommitAbortOwnership(t *testing.T) {
	eng := newEngine(t, memstore.New())
	ctx := context.Background()

	d := proceed(t, eng, request("k", payBody))
	require.NoError(t, eng.Commit(ctx, d, created("1")))
	assert.ErrorIs(t, eng.Commit(ctx, d, created("2")), core.ErrFinished)
	assert.ErrorIs(t, eng.Abort(ctx, d, nil), core.ErrFinished)
	assert.Equal(t, []byte("1"), decide(t, eng, request("k", payBody)).Response.Body)

	d = proceed(t, eng, request("k2", payBody))
	require.NoError(t, eng.Abort(ctx, d, errors.New("handler failed")))
	assert.ErrorIs(t, eng.Abort(ctx, d, nil), core.ErrFinished)
	assert.ErrorIs(t, eng.Commit(ctx, d, created("x")), core.ErrFinished)

	replay := decide(t, eng, request("k", payBody))
	reject := decide(t, eng, request("", payBody))
	bypass := decide(t, eng, core.Request{Method: "GET", Route: "/pay"})
	for _, d := range []*core.Decision{replay, reject, bypass, nil, {}} {
		assert.ErrorIs(t, eng.Commit(ctx, d, created("x")), core.ErrNotOwner)
		assert.ErrorIs(t, eng.Abort(ctx, d, nil), core.ErrNotOwner)
	}

	// A decision belongs to the engine that made it.
	other := newEngine(t, memstore.New())
	d = proceed(t, eng, request("k3", payBody))
	assert.ErrorIs(t, other.Commit(ctx, d, created("x")), core.ErrNotOwner)
	require.NoError(t, eng.Commit(ctx, d, created("x")))
}

// Commit and Abort run detached from the request's cancellation.
func TestCommitAbortDetached(t *testing.T) {
	eng := newEngine(t, memstore.New())
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	d := proceed(t, eng, request("commit", payBody))
	require.NoError(t, eng.Commit(d.Context(cancelled), d, created("stored")))
	r := decide(t, eng, request("commit", payBody))
	require.Equal(t, core.Replay, r.Outcome)
	assert.Equal(t, "stored", string(r.Response.Body))

	d = proceed(t, eng, request("abort", payBody))
	require.NoError(t, eng.Abort(cancelled, d, context.Canceled))
	d = proceed(t, eng, request("abort", payBody)) // released: runs again
	require.NoError(t, eng.Abort(context.Background(), d, nil))

	// Nothing written and the client gone: no result, the key is released.
	d = proceed(t, eng, request("gone", payBody))
	require.NoError(t, eng.Commit(cancelled, d, adapterkit.Response{}))
	d = proceed(t, eng, request("gone", payBody))
	require.NoError(t, eng.Abort(context.Background(), d, nil))

	// A deadline that passed is no different.
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	d = proceed(t, eng, request("deadline", payBody))
	require.NoError(t, eng.Commit(expired, d, created("late")))
	assert.Equal(t, core.Replay, decide(t, eng, request("deadline", payBody)).Outcome)
}

func TestCommitTimeout(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	var sawDeadline atomic.Bool
	s := &slowCompleteStore{Store: memstore.New(), block: block, sawDeadline: &sawDeadline}
	eng := newEngine(t, s, core.WithCommitTimeout(50*time.Millisecond))
	d := proceed(t, eng, request("k", payBody))
	start := time.Now()
	err := eng.Commit(context.Background(), d, created("x"))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.True(t, sawDeadline.Load())
}

type slowCompleteStore struct {
	core.Store
	block       chan struct{}
	sawDeadline *atomic.Bool
}

func (s *slowCompleteStore) Complete(ctx context.Context, f storekit.Fence, r storekit.StoredResponse) error {
	_, ok := ctx.Deadline()
	s.sawDeadline.Store(ok)
	if l, ok := storekit.LeaseFromContext(ctx); !ok || l.Fence() != f {
		return errors.New("commit context lacks the lease")
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.block:
		return s.Store.Complete(ctx, f, r)
	}
}

type ctxMarker struct{}

func TestDecisionContext(t *testing.T) {
	eng := newEngine(t, memstore.New())
	d := proceed(t, eng, request("ctx-key", payBody))
	parent := context.WithValue(context.Background(), ctxMarker{}, "v")
	ctx := d.Context(parent)
	assert.Equal(t, "v", ctx.Value(ctxMarker{}))
	key, ok := core.KeyFromContext(ctx)
	assert.True(t, ok)
	assert.Equal(t, "ctx-key", key)
	l, ok := storekit.LeaseFromContext(ctx)
	require.True(t, ok)
	assert.Equal(t, storekit.Fence{Scope: d.Scope, Key: d.Key, Token: l.Fence().Token}, l.Fence())
	assert.Positive(t, l.Fence().Token)
	assert.NoError(t, ctx.Err())

	require.NoError(t, eng.Commit(ctx, d, created("x")))
	assert.Error(t, ctx.Err(), "the handler's context ends with the execution")
	assert.ErrorIs(t, context.Cause(ctx), core.ErrFinished)
	late := d.Context(parent)
	assert.ErrorIs(t, context.Cause(late), core.ErrFinished)

	// Non-Proceed decisions hand the parent back untouched.
	r := decide(t, eng, request("ctx-key", payBody))
	assert.Equal(t, parent, r.Context(parent))
	assert.Equal(t, storekit.Fence{}, r.Fence())
	_, ok = core.KeyFromContext(parent)
	assert.False(t, ok)
	var nilD *core.Decision
	assert.Equal(t, parent, nilD.Context(parent))
}

func TestRelayKey(t *testing.T) {
	relay := func(scope, key, label string) string {
		ctx := storetest.ContextWithLease(context.Background(), storetest.NewLease(nil, storekit.Fence{Scope: scope, Key: key, Token: 1}))
		return core.RelayKey(ctx, label)
	}
	base := relay("s", "k", "stripe")
	assert.True(t, strings.HasPrefix(base, "idem_"), base)
	assert.Equal(t, base, relay("s", "k", "stripe"), "deterministic")
	// The token does not matter: a takeover relays the same key.
	ctx := storetest.ContextWithLease(context.Background(), storetest.NewLease(nil, storekit.Fence{Scope: "s", Key: "k", Token: 99}))
	assert.Equal(t, base, core.RelayKey(ctx, "stripe"))
	seen := map[string]string{base: "base"}
	for name, k := range map[string]string{
		"scope":    relay("s2", "k", "stripe"),
		"key":      relay("s", "k2", "stripe"),
		"label":    relay("s", "k", "stripe2"),
		"shift1":   relay("sk", "", "stripe"),
		"shift2":   relay("", "sk", "stripe"),
		"shift3":   relay("s", "kstripe", ""),
		"empty":    relay("", "", ""),
		"swap s/k": relay("k", "s", "stripe"),
	} {
		if prev, dup := seen[k]; dup {
			t.Errorf("relay key for %s equals the one for %s", name, prev)
		}
		seen[k] = name
	}
	assert.Equal(t, "", core.RelayKey(context.Background(), "stripe"))

	// Through the engine: the relay key survives a retry after failure.
	eng := newEngine(t, memstore.New())
	req := request("k", payBody)
	req.Scope = "s"
	d := proceed(t, eng, req)
	first := core.RelayKey(d.Context(context.Background()), "stripe")
	rec, err := eng.Store().Get(context.Background(), "s", "k")
	require.NoError(t, err)
	assert.Equal(t, eng.RelayKeyOf(rec, "stripe"), first, "the relay key of the record (relaykey_test.go)")
	require.NoError(t, eng.Commit(context.Background(), d, adapterkit.Response{Status: 502}))
	req.Body = strings.NewReader(payBody)
	d = proceed(t, eng, req)
	assert.Equal(t, first, core.RelayKey(d.Context(context.Background()), "stripe"))
	require.NoError(t, eng.Abort(context.Background(), d, nil))
}

func TestWaitMode(t *testing.T) {
	t.Run("replays when the owner commits", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			eng := newEngine(t, memstore.New(), core.WithWait(5*time.Second))
			owner := proceed(t, eng, request("k", payBody))
			done := make(chan *core.Decision, 1)
			go func() {
				d, err := eng.Decide(context.Background(), request("k", payBody))
				if err != nil {
					t.Errorf("Decide: %v", err)
				}
				done <- d
			}()
			synctest.Wait() // the duplicate is blocked (waiting) or has answered
			select {
			case <-done:
				t.Fatal("the duplicate did not wait for the owner")
			default:
			}
			start := time.Now()
			require.NoError(t, eng.Commit(context.Background(), owner, created("first")))
			select {
			case d := <-done:
				require.Equal(t, core.Replay, d.Outcome)
				assert.Equal(t, "first", string(d.Response.Body))
				assert.Zero(t, time.Since(start), "woken by the commit, not by a later poll")
			case <-time.After(5 * time.Second):
				t.Fatal("waiter never returned")
			}
		})
	})
	t.Run("takes over when the owner aborts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			eng := newEngine(t, memstore.New(), core.WithWait(5*time.Second))
			owner := proceed(t, eng, request("k", payBody))
			done := make(chan *core.Decision, 1)
			go func() {
				d, _ := eng.Decide(context.Background(), request("k", payBody))
				done <- d
			}()
			synctest.Wait() // the duplicate is waiting
			start := time.Now()
			require.NoError(t, eng.Abort(context.Background(), owner, errors.New("boom")))
			select {
			case d := <-done:
				require.Equal(t, core.Proceed, d.Outcome)
				assert.Zero(t, time.Since(start), "woken by the abort, not by a later poll")
				assert.Greater(t, d.Fence().Token, owner.Fence().Token)
				require.NoError(t, eng.Commit(context.Background(), d, created("second")))
			case <-time.After(5 * time.Second):
				t.Fatal("waiter never returned")
			}
		})
	})
	t.Run("falls back to 409 after the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			eng := newEngine(t, memstore.New(), core.WithWait(150*time.Millisecond))
			owner := proceed(t, eng, request("k", payBody))
			start := time.Now()
			d := decide(t, eng, request("k", payBody))
			took := time.Since(start)
			requireProblem(t, d, http.StatusConflict, problem.InFlight)
			assert.GreaterOrEqual(t, took, 150*time.Millisecond)
			assert.Less(t, took, 2*time.Second)
			require.NoError(t, eng.Abort(context.Background(), owner, nil))
		})
	})
	t.Run("stops waiting when the request is cancelled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			eng := newEngine(t, memstore.New(), core.WithWait(10*time.Second))
			owner := proceed(t, eng, request("k", payBody))
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			d, err := eng.Decide(ctx, request("k", payBody))
			took := time.Since(start)
			assert.Less(t, took, 5*time.Second)
			if err == nil {
				assert.Equal(t, core.Reject, d.Outcome)
			}
			require.NoError(t, eng.Abort(context.Background(), owner, nil))
		})
	})
	t.Run("mismatch is not waited for", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			eng := newEngine(t, memstore.New(), core.WithWait(10*time.Second))
			owner := proceed(t, eng, request("k", payBody))
			start := time.Now()
			requireProblem(t, decide(t, eng, request("k", "{}")), http.StatusUnprocessableEntity, problem.PayloadMismatch)
			assert.Zero(t, time.Since(start), "a mismatch answered without waiting") // simulated time
			require.NoError(t, eng.Abort(context.Background(), owner, nil))
		})
	})
}

func TestRetention(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	eng := newEngine(t, memstore.New(memstore.WithClock(clock)), core.WithRetention(time.Hour))
	d := proceed(t, eng, request("k", payBody))
	require.NoError(t, eng.Commit(context.Background(), d, created("old")))
	advance(59 * time.Minute)
	assert.Equal(t, core.Replay, decide(t, eng, request("k", payBody)).Outcome)
	advance(2 * time.Minute)
	// Past retention the key is new again, even with another body.
	d = proceed(t, eng, request("k", `{"new":true}`))
	require.NoError(t, eng.Abort(context.Background(), d, nil))
}

func TestProblemResponses(t *testing.T) {
	// The URIs are a public contract: changing one breaks clients.
	stable := map[string]int{
		"https://idemkit.dev/problems/missing-key":       400,
		"https://idemkit.dev/problems/invalid-key":       400,
		"https://idemkit.dev/problems/payload-mismatch":  422,
		"https://idemkit.dev/problems/in-flight":         409,
		"https://idemkit.dev/problems/not-retained":      409,
		"https://idemkit.dev/problems/body-too-large":    413,
		"https://idemkit.dev/problems/body-unreadable":   400,
		"https://idemkit.dev/problems/store-unavailable": 503,
		"https://idemkit.dev/problems/scope-unavailable": 401,
		"https://idemkit.dev/problems/handler-panic":     500,
	}
	for uri, status := range stable {
		name := strings.TrimPrefix(uri, problem.BaseURI)
		r := core.ProblemResponse(name, status, "some \"detail\" <here>")
		assert.Equal(t, status, r.Status)
		assert.Equal(t, "application/problem+json", r.Header.Get("Content-Type"))
		assert.Equal(t, "no-store", r.Header.Get("Cache-Control"))
		var m map[string]any
		require.NoError(t, json.Unmarshal(r.Body, &m), "%s: %q", name, r.Body)
		assert.Equal(t, uri, m["type"])
		assert.NotEmpty(t, m["title"], name)
		assert.EqualValues(t, status, m["status"])
		assert.Equal(t, "some \"detail\" <here>", m["detail"])
		for k := range m {
			assert.Contains(t, []string{"type", "title", "status", "detail"}, k)
		}
	}
	bare := core.ProblemResponse(problem.InFlight, 409, "")
	var p problem.Details
	require.NoError(t, json.Unmarshal(bare.Body, &p))
	assert.Equal(t, problem.BaseURI+"in-flight", p.Type)
	assert.NotContains(t, string(bare.Body), "detail", "empty detail is omitted")

	eng := newEngine(t, memstore.New())
	requireType := problemOf(t, decide(t, eng, request("", payBody))).Type
	assert.Equal(t, problem.BaseURI+"missing-key", requireType)
	pr := eng.PanicResponse()
	assert.Equal(t, 500, pr.Status)
	require.NoError(t, json.Unmarshal(pr.Body, &p))
	assert.Equal(t, problem.BaseURI+"handler-panic", p.Type)

	ce := eng.CommitErrorResponse(errors.New("db down"))
	assert.Equal(t, 503, ce.Status)
	assert.Equal(t, "1", ce.Header.Get("Retry-After"))
	ce = eng.CommitErrorResponse(core.ErrLeaseLost)
	assert.Equal(t, 409, ce.Status)
	ce = eng.CommitErrorResponse(errors.Join(errors.New("store: complete"), storekit.ErrNotCommitted))
	assert.Equal(t, 500, ce.Status)
	require.NoError(t, json.Unmarshal(ce.Body, &p))
	assert.Equal(t, problem.BaseURI+"handler-error", p.Type)
}

func TestLogsRedactKeys(t *testing.T) {
	const key = "secret-key-0123456789"
	run := func() string {
		var buf bytes.Buffer
		var mu sync.Mutex
		w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
		logger := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
		eng := newEngine(t, memstore.New(), core.WithLogger(logger))
		d := proceed(t, eng, request(key, payBody))
		requireProblem(t, decide(t, eng, request(key, payBody)), 409, problem.InFlight)
		requireProblem(t, decide(t, eng, request(key, "{}")), 422, problem.PayloadMismatch)
		require.NoError(t, eng.Commit(context.Background(), d, created("x")))
		require.Equal(t, core.Replay, decide(t, eng, request(key, payBody)).Outcome)
		d = proceed(t, eng, request(key+"-2", payBody))
		require.NoError(t, eng.Abort(context.Background(), d, errors.New("cause mentions nothing")))
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
	redacted := run()
	assert.NotContains(t, redacted, key)
	assert.Contains(t, redacted, `"key":"`+core.RedactKey(key)+`"`) // the lines that would name it are there
	for _, msg := range []string{"idem: claim", "idem: conflict", "idem: mismatch", "idem: commit", "idem: replay", "idem: abort"} {
		assert.Contains(t, redacted, msg)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestObserver(t *testing.T) {
	var mu sync.Mutex
	var kinds []string
	eng := newEngine(t, memstore.New(), core.WithObserver(func(ev core.Event) {
		mu.Lock()
		kinds = append(kinds, string(ev.Kind))
		mu.Unlock()
	}))
	ctx := context.Background()
	decide(t, eng, core.Request{Method: "GET"})
	decide(t, eng, request("", payBody))
	d := proceed(t, eng, request("k", payBody))
	decide(t, eng, request("k", payBody))
	decide(t, eng, request("k", "{}"))
	require.NoError(t, eng.Commit(ctx, d, created("x")))
	decide(t, eng, request("k", payBody))
	d = proceed(t, eng, request("k2", payBody))
	require.NoError(t, eng.Commit(ctx, d, adapterkit.Response{Status: 500}))
	d = proceed(t, eng, request("k2", payBody))
	require.NoError(t, eng.Abort(ctx, d, nil))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"bypass", "rejected", "claim", "conflict", "mismatch", "commit", "replay", "claim", "fail", "claim", "abort"}, kinds)
}

// core must stay standard-library only (its own kits, which import only the
// standard library themselves, aside).
func TestCoreDependsOnStdlibOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/idemkit/idem/core").CombinedOutput()
	require.NoError(t, err, "%s", out)
	pkgs := strings.Fields(string(out))
	require.Contains(t, pkgs, "github.com/idemkit/idem/core")
	require.Contains(t, pkgs, "net/http", "sanity: the list holds the standard library")
	for _, p := range pkgs {
		if p == "github.com/idemkit/idem/core" || strings.HasPrefix(p, "github.com/idemkit/idem/core/") {
			continue
		}
		first, _, _ := strings.Cut(p, "/")
		assert.NotContains(t, first, ".", "core depends on the non-standard package %s", p)
	}
}

// The Retry-After hint follows WithRetryAfter but never exceeds the lease left.
func TestRetryAfterHint(t *testing.T) {
	eng := newEngine(t, memstore.New(), core.WithRetryAfter(10*time.Second))
	first := proceed(t, eng, request("k", payBody))
	d := decide(t, eng, request("k", payBody))
	requireProblem(t, d, http.StatusConflict, problem.InFlight)
	assert.Equal(t, "10", d.Response.Header.Get("Retry-After"))
	require.NoError(t, eng.Abort(context.Background(), first, nil))

	eng = newEngine(t, memstore.New(), core.WithRetryAfter(time.Hour), core.WithLease(2*time.Second))
	first = proceed(t, eng, request("k", payBody))
	d = decide(t, eng, request("k", payBody))
	requireProblem(t, d, http.StatusConflict, problem.InFlight)
	assert.Equal(t, "2", d.Response.Header.Get("Retry-After"), "capped by the lease left")
	require.NoError(t, eng.Abort(context.Background(), first, nil))

	_, err := core.New(memstore.New(), core.WithRetryAfter(10*time.Millisecond))
	assert.Error(t, err)
}

// Engines built concurrently must not share mutable option state (the
// default header allow-list is a package variable).
func TestNewConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := core.New(memstore.New(), core.WithReplayHeaders("content-type", "location")); err != nil {
				t.Errorf("New: %v", err)
			}
			if _, err := core.New(memstore.New()); err != nil {
				t.Errorf("New: %v", err)
			}
		}()
	}
	wg.Wait()
	assert.Contains(t, idemtest.ReplayHeaders(), "Content-Type")
}

// One key reused on another resource under the same route template
// (/orders/1/confirm, then /orders/2/confirm) is a different request: 422,
// never order 1's answer replayed for order 2.
func TestTargetIsPartOfFingerprint(t *testing.T) {
	eng := newEngine(t, memstore.New())
	first := request("k", payBody)
	first.Route, first.Target = "/orders/{id}/confirm", "/orders/1/confirm"
	d := proceed(t, eng, first)
	require.NoError(t, eng.Commit(context.Background(), d, created(`{"order":1}`)))

	other := request("k", payBody)
	other.Route, other.Target = "/orders/{id}/confirm", "/orders/2/confirm"
	requireProblem(t, decide(t, eng, other), http.StatusUnprocessableEntity, problem.PayloadMismatch)

	same := request("k", payBody)
	same.Route, same.Target = "/orders/{id}/confirm", "/orders/1/confirm"
	assert.Equal(t, core.Replay, decide(t, eng, same).Outcome)
}

// idem mounted twice (globally and on a route) must not refuse its own
// request: the inner Decide sees the outer lease and lets it through.
func TestNestedDecideBypasses(t *testing.T) {
	eng := newEngine(t, memstore.New())
	outer := proceed(t, eng, request("k", payBody))
	ctx := outer.Context(context.Background())
	inner, err := eng.Decide(ctx, request("k", payBody))
	require.NoError(t, err)
	assert.Equal(t, core.Bypass, inner.Outcome)
	require.NoError(t, eng.Commit(ctx, outer, created(`{}`)))
}

// nilWatcher is a counting store whose Watcher cannot watch.
type nilWatcher struct{ countingStore }

func (*nilWatcher) Watch(context.Context, string, string) (<-chan struct{}, func()) { return nil, nil }

// A Watcher that returns no channel is polled instead of spun on.
func TestWaitWithNilWatcherPolls(t *testing.T) {
	s := &nilWatcher{countingStore{Store: memstore.New()}}
	eng := newEngine(t, s, core.WithWait(300*time.Millisecond), core.WithWaitPoll(50*time.Millisecond))
	first := proceed(t, eng, request("k", payBody))
	d := decide(t, eng, request("k", payBody))
	requireProblem(t, d, http.StatusConflict, problem.InFlight)
	// 1 claim for the owner, then about one per poll for the waiter: a spin
	// would make thousands.
	assert.Less(t, s.claims.Load(), int64(20))
	require.NoError(t, eng.Abort(context.Background(), first, nil))
}

// The kits core imports never import core (no cycle can form as they grow)
// and need only the standard library.
func TestKitsDependOnStdlibOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, kit := range []string{"adapterkit", "storekit", "internal/leasehook"} {
		out, err := exec.Command("go", "list", "-deps", "github.com/idemkit/idem/core/"+kit).CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, p := range strings.Fields(string(out)) {
			if strings.HasPrefix(p, "github.com/idemkit/idem/core/") {
				continue
			}
			first, _, _ := strings.Cut(p, "/")
			assert.NotContains(t, first, ".", "core/%s depends on %s", kit, p)
		}
	}
}
