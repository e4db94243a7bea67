package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/internal/testkit/assert"
	"github.com/idemkit/idem/internal/testkit/require"
)

const (
	// longLease and longRetention are long enough never to lapse during a test.
	longLease     = time.Minute
	longRetention = time.Hour
	// shortLease and shortRetention lapse within a test; waits sleep for
	// lapse, comfortably more, so that a store's clock granularity or a
	// loaded CI machine does not make the suite flaky.
	shortLease     = 50 * time.Millisecond
	shortRetention = 100 * time.Millisecond
	lapse          = 2 * shortRetention
	// clockTolerance bounds how far LockedUntil, ExpiresAt and CreatedAt
	// may sit from ClaimResult.Now plus the requested duration. Stores that
	// compute all of them from one "now" are exact; the tolerance only
	// absorbs timestamp rounding (PostgreSQL keeps microseconds).
	clockTolerance = 5 * time.Millisecond
	// wakeTimeout bounds how long a storekit.Watcher may take to report a
	// change; generous, since a store may deliver it asynchronously.
	wakeTimeout = 5 * time.Second
	// workers is the number of goroutines in the concurrency sub-tests.
	workers = 64
)

// testCase is one sub-test; it gets a fresh store.
type testCase struct {
	name string
	fn   func(t *testing.T, s core.Store)
}

// Run runs the conformance suite against the stores newStore returns.
// newStore is called once per sub-test with that sub-test's *testing.T and
// must return a usable store (see the package doc).
func Run(t *testing.T, newStore func(tb testing.TB) core.Store) {
	t.Helper()
	groups := []struct {
		name  string
		cases []testCase
	}{
		{"Claim", []testCase{
			{"Fresh", testClaimFresh},
			{"TokensIncrease", testClaimTokensIncrease},
			{"ExistingProcessing", testClaimExistingProcessing},
			{"ExistingCompleted", testClaimExistingCompleted},
			{"FailedSameFingerprintTakeover", testClaimFailedTakeover},
			{"FailedMismatchNotTakenOver", testClaimFailedMismatch},
			{"ExpiredLeaseTakeover", testClaimExpiredLease},
		}},
		{"Fence", []testCase{
			{"StaleToken", testFenceStaleToken},
			{"FinishedRecord", testFenceFinishedRecord},
			{"UnknownTokenOrKey", testFenceUnknown},
		}},
		{"Heartbeat", []testCase{
			{"ExtendsLease", testHeartbeatExtends},
		}},
		{"Retention", []testCase{
			{"ExpiredKeyIsNewAgain", testRetention},
		}},
		{"Scope", []testCase{
			{"Isolation", testScopeIsolation},
			{"NoConcatenationCollision", testScopeNoCollision},
			{"Empty", testScopeEmpty},
		}},
		{"Response", []testCase{
			{"StatusAndHeaders", testResponseHeaders},
			{"HeaderBytes", testResponseHeaderBytes},
			{"NilBody", func(t *testing.T, s core.Store) { testResponseBody(t, s, nil) }},
			{"EmptyBody", func(t *testing.T, s core.Store) { testResponseBody(t, s, []byte{}) }},
			{"BinaryBody", func(t *testing.T, s core.Store) { testResponseBody(t, s, binaryBody()) }},
			{"LargeBody", func(t *testing.T, s core.Store) { testResponseBody(t, s, randomBytes(t, 1<<20)) }},
			{"NotRetained", testResponseNotRetained},
		}},
		{"NoAliasing", []testCase{
			{"Complete", testAliasComplete},
			{"HandedOutStaysPut", testHandedOutStaysPut},
		}},
		{"Get", []testCase{
			{"Missing", testGetMissing},
		}},
		{"Context", []testCase{
			{"Cancelled", testContextCancelled},
			{"DeadlineExceeded", testContextDeadline},
		}},
		{"Concurrent", []testCase{
			{"SameKey", testConcurrentSameKey},
			{"DistinctKeys", testConcurrentDistinctKeys},
			{"ExpiredLeaseTakeover", testConcurrentExpiredTakeover},
			{"FailedTakeover", testConcurrentFailedTakeover},
			{"Complete", testConcurrentComplete},
		}},
		{"Watcher", []testCase{
			{"WakesOnChange", testWatcherWakes},
			{"DoneContext", testWatcherDoneContext},
		}},
		{"Steps", stepCases},              // steps.go
		{"Incarnation", incarnationCases}, // incarnation.go
		{"RelayKey", relayCases},          // incarnation.go
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					s := newStore(t)
					if s == nil {
						t.Fatal("storetest: newStore returned nil")
					}
					c.fn(t, s)
				})
			}
		})
	}
}

// ---------------------------------------------------------------- helpers

// prefix makes keys unique across runs sharing one backing store.
var (
	prefix  = randomHex(6)
	counter atomic.Int64
)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// unique returns a name never returned before in this process.
func unique(kind string) string {
	return fmt.Sprintf("%s-%s-%d", kind, prefix, counter.Add(1))
}

func fingerprint(body string) string {
	return core.Fingerprint(core.FingerprintInput{Method: http.MethodPost, Route: "/v1/payments", Body: []byte(body)})
}

// newReq returns a claim request for a fresh (scope, key) with long lease
// and retention.
func newReq() storekit.ClaimRequest {
	return storekit.ClaimRequest{
		Scope:       unique("scope"),
		Key:         unique("key"),
		Method:      http.MethodPost,
		Route:       "/v1/payments",
		Fingerprint: fingerprint(`{"amount":1000}`),
		Lease:       longLease,
		Retention:   longRetention,
	}
}

func fence(r storekit.Record) storekit.Fence {
	return storekit.Fence{Scope: r.Scope, Key: r.Key, Token: r.Token}
}

func claim(t *testing.T, s core.Store, req storekit.ClaimRequest) storekit.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), req)
	require.NoError(t, err, "Claim(%s/%s)", req.Scope, req.Key)
	return res
}

func claimNew(t *testing.T, s core.Store, req storekit.ClaimRequest) storekit.ClaimResult {
	t.Helper()
	res := claim(t, s, req)
	require.True(t, res.Claimed, "Claim of a new key must claim it")
	return res
}

func get(t *testing.T, s core.Store, scope, key string) storekit.Record {
	t.Helper()
	rec, err := s.Get(t.Context(), scope, key)
	require.NoError(t, err, "Get(%s/%s)", scope, key)
	return rec
}

func sampleResponse() storekit.StoredResponse {
	return storekit.StoredResponse{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/v1/payments/pay_1"},
			"Link":         {`</a>; rel="a"`, `</b>; rel="b"`},
		},
		Body: []byte(`{"id":"pay_1","amount":1000}`),
	}
}

// requireSameRecord compares two records field by field: times with Equal
// (a store may return another location or monotonic reading), responses
// with nil and empty treated alike.
func requireSameRecord(t *testing.T, want, got storekit.Record, msgAndArgs ...any) {
	t.Helper()
	ctx := fmt.Sprint(msgAndArgs...)
	assert.Equal(t, want.Scope, got.Scope, "Scope %s", ctx)
	assert.Equal(t, want.Key, got.Key, "Key %s", ctx)
	assert.Equal(t, want.Method, got.Method, "Method %s", ctx)
	assert.Equal(t, want.Route, got.Route, "Route %s", ctx)
	assert.Equal(t, want.Fingerprint, got.Fingerprint, "Fingerprint %s", ctx)
	assert.Equal(t, want.Status, got.Status, "Status %s", ctx)
	assert.Equal(t, want.Token, got.Token, "Token %s", ctx)
	assert.True(t, want.LockedUntil.Equal(got.LockedUntil), "LockedUntil %s: want %v, got %v", ctx, want.LockedUntil, got.LockedUntil)
	assert.True(t, want.CreatedAt.Equal(got.CreatedAt), "CreatedAt %s: want %v, got %v", ctx, want.CreatedAt, got.CreatedAt)
	assert.True(t, want.ExpiresAt.Equal(got.ExpiresAt), "ExpiresAt %s: want %v, got %v", ctx, want.ExpiresAt, got.ExpiresAt)
	requireSameResponse(t, want.Response, got.Response, ctx)
	if t.Failed() {
		t.FailNow()
	}
}

func requireSameResponse(t *testing.T, want, got *storekit.StoredResponse, msgAndArgs ...any) {
	t.Helper()
	ctx := fmt.Sprint(msgAndArgs...)
	if want == nil || got == nil {
		require.True(t, want == nil && got == nil, "Response %s: want %+v, got %+v", ctx, want, got)
		return
	}
	assert.Equal(t, want.Status, got.Status, "Response.Status %s", ctx)
	assert.Equal(t, want.NotRetained, got.NotRetained, "Response.NotRetained %s", ctx)
	assert.True(t, sameHeader(want.Header, got.Header), "Response.Header %s: want %v, got %v", ctx, want.Header, got.Header)
	// Not assert.Equal: a 1 MiB diff is useless, and nil == empty here.
	if !bytes.Equal(want.Body, got.Body) {
		t.Errorf("Response.Body %s: want %d bytes, got %d bytes (first difference at %d)",
			ctx, len(want.Body), len(got.Body), firstDiff(want.Body, got.Body))
	}
	if t.Failed() {
		t.FailNow()
	}
}

func sameHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv, ok := b[k]
		if !ok || len(av) != len(bv) {
			return false
		}
		for i := range av {
			if av[i] != bv[i] {
				return false
			}
		}
	}
	return true
}

func firstDiff(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func requireNear(t *testing.T, want, got time.Time, what string) {
	t.Helper()
	require.WithinDuration(t, want, got, clockTolerance, "%s", what)
}

func requireLeaseLost(t *testing.T, err error, op string) {
	t.Helper()
	require.Error(t, err, "%s must be refused", op)
	require.ErrorIs(t, err, core.ErrLeaseLost, "%s", op)
}

// ------------------------------------------------------------------ claim

func testClaimFresh(t *testing.T, s core.Store) {
	req := newReq()
	res := claimNew(t, s, req)
	rec := res.Record
	require.False(t, res.Now.IsZero(), "ClaimResult.Now must be set")
	assert.Positive(t, rec.Token)
	assert.Equal(t, storekit.StatusProcessing, rec.Status)
	assert.Equal(t, req.Scope, rec.Scope)
	assert.Equal(t, req.Key, rec.Key)
	assert.Equal(t, req.Method, rec.Method)
	assert.Equal(t, req.Route, rec.Route)
	assert.Equal(t, req.Fingerprint, rec.Fingerprint)
	assert.Nil(t, rec.Response, "a processing record has no response")
	requireNear(t, res.Now.Add(req.Lease), rec.LockedUntil, "LockedUntil = Now + Lease")
	requireNear(t, res.Now.Add(req.Retention), rec.ExpiresAt, "ExpiresAt = Now + Retention")
	requireNear(t, res.Now, rec.CreatedAt, "CreatedAt = Now")

	requireSameRecord(t, rec, get(t, s, req.Scope, req.Key), "Get after Claim")
}

func testClaimTokensIncrease(t *testing.T, s core.Store) {
	var last int64
	for i := range 8 {
		res := claimNew(t, s, newReq())
		require.Greater(t, res.Record.Token, last, "claim %d: tokens are strictly increasing per store", i)
		last = res.Record.Token
	}
}

func testClaimExistingProcessing(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)

	again := claim(t, s, req)
	require.False(t, again.Claimed, "a live lease must not be taken over")
	requireSameRecord(t, first.Record, again.Record, "second Claim returns the record unchanged")

	// A different request under the same key sees the original record
	// (the engine answers 422 from it), which stays unchanged.
	other := req
	other.Fingerprint = fingerprint(`{"amount":50000}`)
	mismatch := claim(t, s, other)
	require.False(t, mismatch.Claimed)
	requireSameRecord(t, first.Record, mismatch.Record, "Claim with another fingerprint")

	requireSameRecord(t, first.Record, get(t, s, req.Scope, req.Key), "Get")
}

func testClaimExistingCompleted(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	resp := sampleResponse()
	require.NoError(t, s.Complete(t.Context(), fence(first.Record), resp))

	want := first.Record
	want.Status = storekit.StatusCompleted
	want.Response = &resp

	again := claim(t, s, req)
	require.False(t, again.Claimed, "a completed record is replayed, never re-run")
	requireSameRecord(t, want, again.Record, "Claim of a completed key")

	other := req
	other.Fingerprint = fingerprint(`{"amount":50000}`)
	mismatch := claim(t, s, other)
	require.False(t, mismatch.Claimed)
	requireSameRecord(t, want, mismatch.Record, "Claim of a completed key with another fingerprint")

	requireSameRecord(t, want, get(t, s, req.Scope, req.Key), "Get")
}

func testClaimFailedTakeover(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	require.NoError(t, s.Fail(t.Context(), fence(first.Record)))

	failed := get(t, s, req.Scope, req.Key)
	assert.Equal(t, storekit.StatusFailed, failed.Status)
	assert.Equal(t, first.Record.Token, failed.Token)
	assert.Nil(t, failed.Response)

	// Different durations than the first claim, so that the check below
	// sees a takeover compute both from its own request and its own now.
	req.Lease, req.Retention = 2*time.Minute, 2*time.Hour
	again := claim(t, s, req)
	require.True(t, again.Claimed, "a failed record is taken over by the same request")
	rec := again.Record
	assert.Greater(t, rec.Token, first.Record.Token, "takeover yields a larger token")
	assert.Equal(t, storekit.StatusProcessing, rec.Status)
	assert.Equal(t, req.Fingerprint, rec.Fingerprint)
	assert.Nil(t, rec.Response)
	requireNear(t, again.Now.Add(req.Lease), rec.LockedUntil, "LockedUntil = Now + Lease after takeover")
	requireNear(t, again.Now.Add(req.Retention), rec.ExpiresAt, "ExpiresAt = Now + Retention after takeover")

	requireSameRecord(t, rec, get(t, s, req.Scope, req.Key), "Get after takeover")
}

func testClaimFailedMismatch(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	require.NoError(t, s.Fail(t.Context(), fence(first.Record)))
	want := get(t, s, req.Scope, req.Key)

	for _, c := range []struct {
		name   string
		mutate func(*storekit.ClaimRequest)
	}{
		{"fingerprint", func(r *storekit.ClaimRequest) { r.Fingerprint = fingerprint(`{"amount":50000}`) }},
		{"method", func(r *storekit.ClaimRequest) { r.Method = http.MethodPatch }},
		{"route", func(r *storekit.ClaimRequest) { r.Route = "/v1/refunds" }},
	} {
		other := req
		c.mutate(&other)
		res := claim(t, s, other)
		require.False(t, res.Claimed, "failed record must not be taken over with another %s", c.name)
		requireSameRecord(t, want, res.Record, "Claim with another "+c.name)
	}
	requireSameRecord(t, want, get(t, s, req.Scope, req.Key), "Get")
}

func testClaimExpiredLease(t *testing.T, s core.Store) {
	req := newReq()
	req.Lease = shortLease
	first := claimNew(t, s, req)
	time.Sleep(lapse)

	// Only the same request may take over a lapsed lease.
	for _, c := range []struct {
		name   string
		mutate func(*storekit.ClaimRequest)
	}{
		{"fingerprint", func(r *storekit.ClaimRequest) { r.Fingerprint = fingerprint(`{"amount":50000}`) }},
		{"method", func(r *storekit.ClaimRequest) { r.Method = http.MethodPut }},
		{"route", func(r *storekit.ClaimRequest) { r.Route = "/v1/refunds" }},
	} {
		other := req
		other.Lease = longLease
		c.mutate(&other)
		res := claim(t, s, other)
		require.False(t, res.Claimed, "lapsed lease must not be taken over with another %s", c.name)
		requireSameRecord(t, first.Record, res.Record, "Claim with another "+c.name)
	}

	req.Lease, req.Retention = longLease, 2*longRetention
	again := claim(t, s, req)
	require.True(t, again.Claimed, "a lapsed lease is taken over by the same request")
	assert.Greater(t, again.Record.Token, first.Record.Token, "takeover bumps the token")
	assert.Equal(t, storekit.StatusProcessing, again.Record.Status)
	requireNear(t, again.Now.Add(req.Lease), again.Record.LockedUntil, "LockedUntil = Now + Lease after takeover")
	requireNear(t, again.Now.Add(req.Retention), again.Record.ExpiresAt, "ExpiresAt = Now + Retention after takeover")

	// The new owner's lease is live: nobody else takes it over.
	third := claim(t, s, req)
	require.False(t, third.Claimed)
	requireSameRecord(t, again.Record, third.Record, "Claim during the new owner's lease")

	// The zombie cannot write; the new owner can.
	requireLeaseLost(t, s.Complete(t.Context(), fence(first.Record), sampleResponse()), "Complete by the old owner")
	requireSameRecord(t, again.Record, get(t, s, req.Scope, req.Key), "after the old owner's Complete")
	require.NoError(t, s.Complete(t.Context(), fence(again.Record), sampleResponse()), "Complete by the new owner")
	rec := get(t, s, req.Scope, req.Key)
	assert.Equal(t, storekit.StatusCompleted, rec.Status)
	assert.Equal(t, again.Record.Token, rec.Token)
}

// ------------------------------------------------------------------ fence

func testFenceStaleToken(t *testing.T, s core.Store) {
	req := newReq()
	old := claimNew(t, s, req)
	require.NoError(t, s.Fail(t.Context(), fence(old.Record)))
	cur := claimNew(t, s, req) // takeover without sleeping
	require.Greater(t, cur.Record.Token, old.Record.Token)
	stale := fence(old.Record)

	requireLeaseLost(t, s.Complete(t.Context(), stale, sampleResponse()), "Complete with a stale token")
	requireLeaseLost(t, s.Fail(t.Context(), stale), "Fail with a stale token")
	requireLeaseLost(t, s.Heartbeat(t.Context(), stale, time.Hour), "Heartbeat with a stale token")
	requireSameRecord(t, cur.Record, get(t, s, req.Scope, req.Key), "after stale writes")

	// The current owner is unaffected.
	require.NoError(t, s.Heartbeat(t.Context(), fence(cur.Record), longLease))
	resp := sampleResponse()
	require.NoError(t, s.Complete(t.Context(), fence(cur.Record), resp))
	rec := get(t, s, req.Scope, req.Key)
	assert.Equal(t, storekit.StatusCompleted, rec.Status)
	assert.Equal(t, cur.Record.Token, rec.Token)
	requireSameResponse(t, &resp, rec.Response, "new owner's response")
}

func testFenceFinishedRecord(t *testing.T, s core.Store) {
	// Completed: every further write by the same owner is refused.
	req := newReq()
	res := claimNew(t, s, req)
	f := fence(res.Record)
	require.NoError(t, s.Complete(t.Context(), f, sampleResponse()))
	want := get(t, s, req.Scope, req.Key)

	other := sampleResponse()
	other.Status = http.StatusTeapot
	other.Body = []byte("second")
	requireLeaseLost(t, s.Complete(t.Context(), f, other), "second Complete")
	requireLeaseLost(t, s.Fail(t.Context(), f), "Fail after Complete")
	requireLeaseLost(t, s.Heartbeat(t.Context(), f, time.Hour), "Heartbeat after Complete")
	requireSameRecord(t, want, get(t, s, req.Scope, req.Key), "completed record after refused writes")

	// Failed: likewise, until someone takes it over.
	req2 := newReq()
	res2 := claimNew(t, s, req2)
	f2 := fence(res2.Record)
	require.NoError(t, s.Fail(t.Context(), f2))
	want2 := get(t, s, req2.Scope, req2.Key)
	requireLeaseLost(t, s.Complete(t.Context(), f2, sampleResponse()), "Complete after Fail")
	requireLeaseLost(t, s.Fail(t.Context(), f2), "second Fail")
	requireLeaseLost(t, s.Heartbeat(t.Context(), f2, time.Hour), "Heartbeat after Fail")
	requireSameRecord(t, want2, get(t, s, req2.Scope, req2.Key), "failed record after refused writes")
}

func testFenceUnknown(t *testing.T, s core.Store) {
	req := newReq()
	res := claimNew(t, s, req)
	want := res.Record

	for _, c := range []struct {
		name string
		f    storekit.Fence
	}{
		{"zero token", storekit.Fence{Scope: req.Scope, Key: req.Key, Token: 0}},
		{"future token", storekit.Fence{Scope: req.Scope, Key: req.Key, Token: want.Token + 1}},
		{"other scope", storekit.Fence{Scope: unique("scope"), Key: req.Key, Token: want.Token}},
		{"other key", storekit.Fence{Scope: req.Scope, Key: unique("key"), Token: want.Token}},
	} {
		requireLeaseLost(t, s.Complete(t.Context(), c.f, sampleResponse()), "Complete with "+c.name)
		requireLeaseLost(t, s.Fail(t.Context(), c.f), "Fail with "+c.name)
		requireLeaseLost(t, s.Heartbeat(t.Context(), c.f, time.Hour), "Heartbeat with "+c.name)
	}
	requireSameRecord(t, want, get(t, s, req.Scope, req.Key), "after refused writes")

	// Writes to a missing record must not create one.
	_, err := s.Get(t.Context(), req.Scope, unique("key"))
	require.ErrorIs(t, err, storekit.ErrNotFound)
}

// -------------------------------------------------------------- heartbeat

func testHeartbeatExtends(t *testing.T, s core.Store) {
	// a heartbeats right away; b's lease is left to lapse, but nobody takes
	// it over, so its owner still holds it.
	reqA, reqB := newReq(), newReq()
	reqA.Lease, reqB.Lease = 2*shortLease, shortLease
	a := claimNew(t, s, reqA)
	b := claimNew(t, s, reqB)

	require.NoError(t, s.Heartbeat(t.Context(), fence(a.Record), longLease))
	recA := get(t, s, reqA.Scope, reqA.Key)
	assert.True(t, recA.LockedUntil.After(a.Record.LockedUntil.Add(longLease/2)),
		"Heartbeat must extend LockedUntil to store now + extend: was %v, now %v", a.Record.LockedUntil, recA.LockedUntil)
	assert.Equal(t, a.Record.Token, recA.Token, "Heartbeat keeps the token")
	assert.Equal(t, storekit.StatusProcessing, recA.Status)

	time.Sleep(lapse) // a's original lease and b's lease have lapsed

	again := claim(t, s, reqA)
	require.False(t, again.Claimed, "a heartbeated lease must not be taken over after the original lease lapsed")
	assert.Equal(t, a.Record.Token, again.Record.Token)

	require.NoError(t, s.Heartbeat(t.Context(), fence(b.Record), longLease),
		"a lapsed lease nobody took over is still owned by its token")
	againB := claim(t, s, reqB)
	require.False(t, againB.Claimed, "the heartbeat revived the lease")
	require.NoError(t, s.Complete(t.Context(), fence(b.Record), sampleResponse()))
	assert.Equal(t, storekit.StatusCompleted, get(t, s, reqB.Scope, reqB.Key).Status)
}

// -------------------------------------------------------------- retention

func testRetention(t *testing.T, s core.Store) {
	mk := func(lease time.Duration) (storekit.ClaimRequest, storekit.ClaimResult) {
		req := newReq()
		req.Lease, req.Retention = lease, shortRetention
		return req, claimNew(t, s, req)
	}
	// Completed and failed records keep the long LockedUntil of their claim:
	// only a processing record is held by its lease. (A long lease also
	// keeps Complete and Fail from racing the short retention.)
	completedReq, completed := mk(longLease)
	require.NoError(t, s.Complete(t.Context(), fence(completed.Record), sampleResponse()))
	failedReq, failed := mk(longLease)
	require.NoError(t, s.Fail(t.Context(), fence(failed.Record)))
	lapsedReq, lapsed := mk(shortLease)
	liveReq, live := mk(longLease) // processing past retention, lease still live

	time.Sleep(lapse)
	maxToken := max(completed.Record.Token, failed.Record.Token, lapsed.Record.Token, live.Record.Token)

	for _, c := range []struct {
		name string
		req  storekit.ClaimRequest
	}{
		{"completed", completedReq},
		{"failed", failedReq},
		{"processing with lapsed lease", lapsedReq},
	} {
		req := c.req
		req.Method = http.MethodPut
		req.Route = "/v2/payments"
		req.Fingerprint = fingerprint(`{"amount":50000,"new":true}`)
		req.Retention = longRetention
		res := claim(t, s, req)
		require.True(t, res.Claimed, "%s record past retention: the key is new again, whatever the request", c.name)
		rec := res.Record
		assert.Greater(t, rec.Token, maxToken, "%s: the new record gets a fresh, larger token", c.name)
		assert.Equal(t, storekit.StatusProcessing, rec.Status, c.name)
		assert.Equal(t, req.Method, rec.Method, c.name)
		assert.Equal(t, req.Route, rec.Route, c.name)
		assert.Equal(t, req.Fingerprint, rec.Fingerprint, c.name)
		assert.Nil(t, rec.Response, c.name)
		requireNear(t, res.Now, rec.CreatedAt, c.name+": CreatedAt of the new record")
		requireNear(t, res.Now.Add(req.Retention), rec.ExpiresAt, c.name+": ExpiresAt of the new record")
		requireSameRecord(t, rec, get(t, s, req.Scope, req.Key), c.name+": Get")
	}

	other := liveReq
	other.Fingerprint = fingerprint(`{"amount":50000}`)
	res := claim(t, s, other)
	require.False(t, res.Claimed, "a record held by a live lease is not expired, even past ExpiresAt")
	requireSameRecord(t, live.Record, res.Record, "live record past retention")
	require.NoError(t, s.Complete(t.Context(), fence(live.Record), sampleResponse()),
		"the live owner can still complete")
}

// ------------------------------------------------------------------ scope

func testScopeIsolation(t *testing.T, s core.Store) {
	key := unique("key")
	reqA, reqB := newReq(), newReq()
	reqA.Key, reqB.Key = key, key
	reqB.Fingerprint = fingerprint(`{"amount":50000}`)

	a := claimNew(t, s, reqA)
	b := claim(t, s, reqB)
	require.True(t, b.Claimed, "the same key in another scope is another record")
	assert.NotEqual(t, a.Record.Token, b.Record.Token)
	assert.Equal(t, reqB.Fingerprint, b.Record.Fingerprint)

	resp := sampleResponse()
	require.NoError(t, s.Complete(t.Context(), fence(a.Record), resp))
	requireSameRecord(t, b.Record, get(t, s, reqB.Scope, key), "scope B after completing scope A")

	require.NoError(t, s.Fail(t.Context(), fence(b.Record)))
	recA := get(t, s, reqA.Scope, key)
	assert.Equal(t, storekit.StatusCompleted, recA.Status)
	requireSameResponse(t, &resp, recA.Response, "scope A after failing scope B")
	assert.Equal(t, storekit.StatusFailed, get(t, s, reqB.Scope, key).Status)

	_, err := s.Get(t.Context(), unique("scope"), key)
	require.ErrorIs(t, err, storekit.ErrNotFound, "a third scope has no record")
}

func testScopeNoCollision(t *testing.T, s core.Store) {
	// A store that joins scope and key with a separator would confuse these.
	p := unique("p")
	reqA, reqB := newReq(), newReq()
	reqA.Scope, reqA.Key = p+"a", "b:c"
	reqB.Scope, reqB.Key = p+"a:b", "c"
	claimNew(t, s, reqA)
	claimNew(t, s, reqB)
}

func testScopeEmpty(t *testing.T, s core.Store) {
	// The engine uses the empty scope when no tenant is configured; it is a
	// scope like any other.
	reqE, reqX := newReq(), newReq()
	reqE.Scope = ""
	reqX.Key = reqE.Key
	e := claimNew(t, s, reqE)
	assert.Equal(t, "", e.Record.Scope)
	claimNew(t, s, reqX)
	resp := sampleResponse()
	require.NoError(t, s.Complete(t.Context(), fence(e.Record), resp))
	replay := claim(t, s, reqE)
	require.False(t, replay.Claimed)
	requireSameResponse(t, &resp, replay.Record.Response, "replay in the empty scope")
	assert.Equal(t, storekit.StatusProcessing, get(t, s, reqX.Scope, reqX.Key).Status, "another scope is unaffected")
}

// --------------------------------------------------------------- response

// roundTrip completes a fresh key with resp and checks that both Get and a
// replaying Claim return it.
func roundTrip(t *testing.T, s core.Store, resp storekit.StoredResponse, want storekit.StoredResponse) {
	t.Helper()
	req := newReq()
	res := claimNew(t, s, req)
	require.NoError(t, s.Complete(t.Context(), fence(res.Record), resp))

	rec := get(t, s, req.Scope, req.Key)
	require.Equal(t, storekit.StatusCompleted, rec.Status)
	requireSameResponse(t, &want, rec.Response, "via Get")

	replay := claim(t, s, req)
	require.False(t, replay.Claimed)
	requireSameResponse(t, &want, replay.Record.Response, "via Claim")
}

func testResponseHeaders(t *testing.T, s core.Store) {
	resp := storekit.StoredResponse{
		Status: http.StatusAccepted,
		Header: http.Header{
			"Content-Type":        {"application/json; charset=utf-8"},
			"Link":                {`</v1/payments?page=2>; rel="next"`, `</v1/payments?page=9>; rel="last"`, ""},
			"Etag":                {`"v1"`},
			"Content-Disposition": {`attachment; filename*=UTF-8''%E6%94%AF%E6%89%95.pdf`},
			"X-Unicode":           {"支払い ✓"},
		},
		Body: []byte(`{"ok":true}`),
	}
	roundTrip(t, s, resp, resp)

	noHeader := storekit.StoredResponse{Status: http.StatusNoContent}
	roundTrip(t, s, noHeader, noHeader)
}

// testResponseHeaderBytes: a handler may set header values that no field
// value can carry (NUL, invalid UTF-8, other control bytes). By the time
// Complete runs the execution has happened, so Complete must not fail on
// them, and the record must replay. A store that cannot hold NUL or invalid
// UTF-8 (PostgreSQL's text and jsonb) may keep U+FFFD in their place; every
// other byte comes back as it was.
func testResponseHeaderBytes(t *testing.T, s core.Store) {
	values := []string{"a\x00b", "\x00", "\xff\xfe", "ok\xc3", "tab\there", "ctl\x01\x1f\x7f", `quote"back\slash`, "支払い ✓"}
	resp := storekit.StoredResponse{Status: http.StatusCreated, Header: http.Header{"X-Odd": values}, Body: []byte(`{}`)}
	req := newReq()
	res := claimNew(t, s, req)
	require.NoError(t, s.Complete(t.Context(), fence(res.Record), resp), "Complete must not fail on header bytes a field value cannot carry")
	for how, r := range map[string]*storekit.StoredResponse{"via Get": get(t, s, req.Scope, req.Key).Response, "via Claim": claim(t, s, req).Record.Response} {
		require.NotNil(t, r, how)
		got := r.Header["X-Odd"]
		require.Len(t, got, len(values), how)
		for i, v := range values {
			if got[i] != v && got[i] != withReplacementChar(v) {
				t.Errorf("%s: value %q came back as %q", how, v, got[i])
			}
		}
	}
}

// withReplacementChar is v with every NUL and every invalid UTF-8 byte
// replaced by U+FFFD.
func withReplacementChar(v string) string {
	var b []byte
	for i := 0; i < len(v); {
		r, size := utf8.DecodeRuneInString(v[i:])
		if r == 0 || (r == utf8.RuneError && size == 1) {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, v[i:i+size]...)
		}
		i += size
	}
	return string(b)
}

// testResponseBody checks body round trips; nil and empty both read back
// as an empty body (requireSameResponse treats them alike).
func testResponseBody(t *testing.T, s core.Store, body []byte) {
	resp := storekit.StoredResponse{
		Status: http.StatusOK,
		Header: http.Header{"Content-Type": {"application/octet-stream"}},
		Body:   body,
	}
	roundTrip(t, s, resp, resp)
}

func binaryBody() []byte {
	b := make([]byte, 0, 512)
	for range 2 {
		for i := range 256 {
			b = append(b, byte(i))
		}
	}
	return b
}

func testResponseNotRetained(t *testing.T, s core.Store) {
	resp := storekit.StoredResponse{Status: http.StatusOK, NotRetained: true}
	roundTrip(t, s, resp, resp)
}

// --------------------------------------------------------------- aliasing

func mutate(resp *storekit.StoredResponse) {
	if resp == nil {
		return
	}
	for i := range resp.Body {
		resp.Body[i] ^= 0xff
	}
	for k, v := range resp.Header {
		for i := range v {
			v[i] = "mutated"
		}
		resp.Header[k] = append(v, "appended")
	}
	if resp.Header != nil {
		resp.Header["X-Injected"] = []string{"yes"}
		delete(resp.Header, "Content-Type")
	}
	resp.Status = http.StatusTeapot
}

func testAliasComplete(t *testing.T, s core.Store) {
	req := newReq()
	res := claimNew(t, s, req)
	resp := sampleResponse()
	require.NoError(t, s.Complete(t.Context(), fence(res.Record), resp))
	mutate(&resp)
	want := sampleResponse()
	requireSameResponse(t, &want, get(t, s, req.Scope, req.Key).Response, "after mutating the completed response")
}

// testHandedOutStaysPut: records returned by Get and Claim are read-only
// and may share memory with the store (core.Store), so the store must never
// modify a response it handed out: when the key expires and is completed
// anew with another response, what earlier callers hold is unchanged.
func testHandedOutStaysPut(t *testing.T, s core.Store) {
	// The replay claim below must land before the record expires: 100ms
	// (shortRetention) lapsed first on a loaded 2-core CI machine, so this
	// case keeps its record for a second and sleeps past it.
	const retention = time.Second
	req := newReq()
	req.Lease, req.Retention = longLease, retention
	start := time.Now()
	res := claimNew(t, s, req)
	require.NoError(t, s.Complete(t.Context(), fence(res.Record), sampleResponse()))
	got := get(t, s, req.Scope, req.Key)
	replay := claim(t, s, req)
	require.False(t, replay.Claimed, "Claim of a completed key")
	require.NotNil(t, replay.Record.Response, "replay's response")

	time.Sleep(time.Until(start.Add(retention)) + lapse) // the key is new again
	req.Retention = longRetention
	again := claimNew(t, s, req)
	other := storekit.StoredResponse{
		Status: http.StatusAccepted,
		Header: http.Header{"Content-Type": {"text/plain"}, "Location": {"/v1/payments/pay_2"}, "Link": {"</c>"}},
		Body:   []byte(`other response, other length`),
	}
	require.NoError(t, s.Complete(t.Context(), fence(again.Record), other))
	requireSameResponse(t, &other, claim(t, s, req).Record.Response, "replay of the new response")
	requireSameResponse(t, &other, get(t, s, req.Scope, req.Key).Response, "Get of the new response")

	want := sampleResponse()
	requireSameResponse(t, &want, got.Response, "a Get result, after the key was completed anew")
	requireSameResponse(t, &want, replay.Record.Response, "a Claim result, after the key was completed anew")
}

// -------------------------------------------------------------------- get

func testGetMissing(t *testing.T, s core.Store) {
	req := newReq()
	_, err := s.Get(t.Context(), req.Scope, req.Key)
	require.ErrorIs(t, err, storekit.ErrNotFound, "Get of a key never claimed")

	claimNew(t, s, req)
	_, err = s.Get(t.Context(), req.Scope, unique("key"))
	require.ErrorIs(t, err, storekit.ErrNotFound, "Get of another key in the same scope")
}

// ---------------------------------------------------------------- context

func testContextCancelled(t *testing.T, s core.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	testDoneContext(t, s, ctx, context.Canceled)
}

func testContextDeadline(t *testing.T, s core.Store) {
	ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	testDoneContext(t, s, ctx, context.DeadlineExceeded)
}

func testDoneContext(t *testing.T, s core.Store, ctx context.Context, want error) {
	// Nothing is created.
	fresh := newReq()
	_, err := s.Claim(ctx, fresh)
	require.ErrorIs(t, err, want, "Claim")
	_, err = s.Get(t.Context(), fresh.Scope, fresh.Key)
	require.ErrorIs(t, err, storekit.ErrNotFound, "a Claim with a done context must not create a record")

	// A claim that would take over does not.
	failedReq := newReq()
	res := claimNew(t, s, failedReq)
	require.NoError(t, s.Fail(t.Context(), fence(res.Record)))
	failed := get(t, s, failedReq.Scope, failedReq.Key)
	_, err = s.Claim(ctx, failedReq)
	require.ErrorIs(t, err, want, "Claim (takeover)")
	requireSameRecord(t, failed, get(t, s, failedReq.Scope, failedReq.Key), "failed record after Claim with a done context")

	// Fence writes do not land.
	req := newReq()
	owned := claimNew(t, s, req)
	f := fence(owned.Record)
	require.ErrorIs(t, s.Heartbeat(ctx, f, time.Hour), want, "Heartbeat")
	require.ErrorIs(t, s.Complete(ctx, f, sampleResponse()), want, "Complete")
	require.ErrorIs(t, s.Fail(ctx, f), want, "Fail")
	_, err = s.Get(ctx, req.Scope, req.Key)
	require.ErrorIs(t, err, want, "Get")
	requireSameRecord(t, owned.Record, get(t, s, req.Scope, req.Key), "record after writes with a done context")

	// And the owner still owns it.
	require.NoError(t, s.Complete(t.Context(), f, sampleResponse()))
}

// ------------------------------------------------------------- concurrent

// claimAll runs workers concurrent Claims of reqs(i) released together and
// returns the results; failed calls are reported and left zero.
func claimAll(t *testing.T, s core.Store, reqs func(i int) storekit.ClaimRequest) []storekit.ClaimResult {
	t.Helper()
	results := make([]storekit.ClaimResult, workers)
	ok := make([]bool, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			<-start
			res, err := s.Claim(t.Context(), reqs(i))
			if err != nil {
				// t.Errorf, never FailNow: this is not the test goroutine.
				t.Errorf("worker %d: Claim: %v", i, err)
				return
			}
			results[i], ok[i] = res, true
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return results
}

// requireOneWinner checks that exactly one of results claimed and that all
// others saw the winner's record.
func requireOneWinner(t *testing.T, results []storekit.ClaimResult) storekit.Record {
	t.Helper()
	var winner storekit.Record
	n := 0
	for _, r := range results {
		if r.Claimed {
			n++
			winner = r.Record
		}
	}
	require.Equal(t, 1, n, "exactly one concurrent Claim must win")
	for i, r := range results {
		assert.Equal(t, winner.Token, r.Record.Token, "worker %d must see the winner's token", i)
		assert.Equal(t, storekit.StatusProcessing, r.Record.Status, "worker %d", i)
	}
	return winner
}

func testConcurrentSameKey(t *testing.T, s core.Store) {
	req := newReq()
	winner := requireOneWinner(t, claimAll(t, s, func(int) storekit.ClaimRequest { return req }))
	requireSameRecord(t, winner, get(t, s, req.Scope, req.Key), "Get after the race")
}

func testConcurrentDistinctKeys(t *testing.T, s core.Store) {
	reqs := make([]storekit.ClaimRequest, workers)
	for i := range reqs {
		reqs[i] = newReq()
	}
	results := claimAll(t, s, func(i int) storekit.ClaimRequest { return reqs[i] })
	seen := make(map[int64]int, workers)
	for i, r := range results {
		require.True(t, r.Claimed, "worker %d: a distinct key must be claimed", i)
		if j, dup := seen[r.Record.Token]; dup {
			t.Fatalf("workers %d and %d got the same token %d", j, i, r.Record.Token)
		}
		seen[r.Record.Token] = i
	}
}

func testConcurrentExpiredTakeover(t *testing.T, s core.Store) {
	req := newReq()
	req.Lease = shortLease
	first := claimNew(t, s, req)
	time.Sleep(lapse)
	req.Lease = longLease
	winner := requireOneWinner(t, claimAll(t, s, func(int) storekit.ClaimRequest { return req }))
	require.Greater(t, winner.Token, first.Record.Token)
	requireLeaseLost(t, s.Complete(t.Context(), fence(first.Record), sampleResponse()), "Complete by the old owner")
	require.NoError(t, s.Complete(t.Context(), fence(winner), sampleResponse()))
}

func testConcurrentFailedTakeover(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	require.NoError(t, s.Fail(t.Context(), fence(first.Record)))
	winner := requireOneWinner(t, claimAll(t, s, func(int) storekit.ClaimRequest { return req }))
	require.Greater(t, winner.Token, first.Record.Token)
}

func testConcurrentComplete(t *testing.T, s core.Store) {
	// Two writers holding the same token (a bug, or a retried Commit) must
	// not both land: exactly one Complete wins and its response is kept.
	req := newReq()
	res := claimNew(t, s, req)
	f := fence(res.Record)
	errs := make([]error, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			<-start
			errs[i] = s.Complete(t.Context(), f, storekit.StoredResponse{Status: http.StatusOK, Body: fmt.Appendf(nil, "worker %d", i)})
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("workers %d and %d both completed with one token", winner, i)
			}
			winner = i
		case !errors.Is(err, core.ErrLeaseLost):
			t.Fatalf("worker %d: Complete: %v, want ErrLeaseLost", i, err)
		}
	}
	require.GreaterOrEqual(t, winner, 0, "one Complete must succeed")
	rec := get(t, s, req.Scope, req.Key)
	require.NotNil(t, rec.Response)
	assert.Equal(t, fmt.Sprintf("worker %d", winner), string(rec.Response.Body), "the winner's response is kept")
}

// ---------------------------------------------------------------- watcher

// watcher returns s as a storekit.Watcher, skipping the test when s is not one
// (the capability is optional).
func watcher(t *testing.T, s core.Store) storekit.Watcher {
	t.Helper()
	w, ok := s.(storekit.Watcher)
	if !ok {
		t.Skip("store does not implement storekit.Watcher")
	}
	return w
}

func requireWoken(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(wakeTimeout)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("Watch channel not closed %v after %s: a missed wake-up leaves a waiter to its poll", wakeTimeout, what)
	}
}

func testWatcherWakes(t *testing.T, s core.Store) {
	w := watcher(t, s)
	req := newReq()

	// Each change a waiter acts on must wake it: the first claim, the
	// owner's Fail (the waiter may take over), a takeover, a Complete
	// (the waiter replays).
	ch, release := w.Watch(t.Context(), req.Scope, req.Key)
	defer release()
	first := claimNew(t, s, req)
	requireWoken(t, ch, "the first Claim")

	ch, release = w.Watch(t.Context(), req.Scope, req.Key)
	defer release()
	require.NoError(t, s.Fail(t.Context(), fence(first.Record)))
	requireWoken(t, ch, "Fail")

	ch, release = w.Watch(t.Context(), req.Scope, req.Key)
	defer release()
	second := claimNew(t, s, req)
	requireWoken(t, ch, "a takeover")

	ch, release = w.Watch(t.Context(), req.Scope, req.Key)
	require.NoError(t, s.Complete(t.Context(), fence(second.Record), sampleResponse()))
	requireWoken(t, ch, "Complete")
	release()
	release() // releasing twice is harmless
}

func testWatcherDoneContext(t *testing.T, s core.Store) {
	// Watch with a done context must neither block nor leak; whether its
	// channel is closed is up to the store.
	w := watcher(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, release := w.Watch(ctx, unique("scope"), unique("key"))
	release()

	ctx, cancel = context.WithCancel(t.Context())
	_, release = w.Watch(ctx, unique("scope"), unique("key"))
	cancel()
	release()
}
