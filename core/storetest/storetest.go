package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
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

// fingerprint stands for the engine's: a store keeps it as an opaque
// string, so any hex SHA-256 that tells bodies apart will do.
func fingerprint(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])
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
	if err != nil {
		t.Fatalf("Claim(%s/%s): %v", req.Scope, req.Key, err)
	}
	return res
}

func claimNew(t *testing.T, s core.Store, req storekit.ClaimRequest) storekit.ClaimResult {
	t.Helper()
	res := claim(t, s, req)
	if !res.Claimed {
		t.Fatalf("Claim of a new key %s/%s: not claimed (found a %s record, token %d), want it claimed",
			req.Scope, req.Key, res.Record.Status, res.Record.Token)
	}
	return res
}

func get(t *testing.T, s core.Store, scope, key string) storekit.Record {
	t.Helper()
	rec, err := s.Get(t.Context(), scope, key)
	if err != nil {
		t.Fatalf("Get(%s/%s): %v", scope, key, err)
	}
	return rec
}

// complete is the owner's Complete of f's record; the store must accept it.
func complete(t *testing.T, s core.Store, f storekit.Fence, resp storekit.StoredResponse) {
	t.Helper()
	if err := s.Complete(t.Context(), f, resp); err != nil {
		t.Fatalf("Complete(%s/%s, token %d) by the owner: %v, want nil", f.Scope, f.Key, f.Token, err)
	}
}

// markFailed is the owner's Fail of f's record; the store must accept it.
func markFailed(t *testing.T, s core.Store, f storekit.Fence) {
	t.Helper()
	if err := s.Fail(t.Context(), f); err != nil {
		t.Fatalf("Fail(%s/%s, token %d) by the owner: %v, want nil", f.Scope, f.Key, f.Token, err)
	}
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
// with nil and empty treated alike. It reports every field that differs,
// then stops the test.
func requireSameRecord(t *testing.T, want, got storekit.Record, what string) {
	t.Helper()
	same := true
	for _, f := range []struct{ name, got, want string }{
		{"Scope", got.Scope, want.Scope},
		{"Key", got.Key, want.Key},
		{"Method", got.Method, want.Method},
		{"Route", got.Route, want.Route},
		{"Fingerprint", got.Fingerprint, want.Fingerprint},
		{"Status", string(got.Status), string(want.Status)},
	} {
		if f.got != f.want {
			t.Errorf("%s: %s = %q, want %q", what, f.name, f.got, f.want)
			same = false
		}
	}
	if got.Token != want.Token {
		t.Errorf("%s: Token = %d, want %d", what, got.Token, want.Token)
		same = false
	}
	for _, f := range []struct {
		name      string
		got, want time.Time
	}{
		{"LockedUntil", got.LockedUntil, want.LockedUntil},
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
		{"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
	} {
		if !f.got.Equal(f.want) {
			t.Errorf("%s: %s = %v, want %v", what, f.name, f.got, f.want)
			same = false
		}
	}
	if !checkSameResponse(t, want.Response, got.Response, what) || !same {
		t.FailNow()
	}
}

// requireSameResponse is checkSameResponse that stops the test on a difference.
func requireSameResponse(t *testing.T, want, got *storekit.StoredResponse, what string) {
	t.Helper()
	if !checkSameResponse(t, want, got, what) {
		t.FailNow()
	}
}

// checkSameResponse reports (t.Errorf) every way got differs from want,
// nil and empty bodies and header maps alike; false when they differ.
func checkSameResponse(t *testing.T, want, got *storekit.StoredResponse, what string) bool {
	t.Helper()
	if want == nil || got == nil {
		if want != nil || got != nil {
			t.Errorf("%s: Response = %+v, want %+v", what, got, want)
			return false
		}
		return true
	}
	same := true
	if got.Status != want.Status {
		t.Errorf("%s: Response.Status = %d, want %d", what, got.Status, want.Status)
		same = false
	}
	if got.NotRetained != want.NotRetained {
		t.Errorf("%s: Response.NotRetained = %v, want %v", what, got.NotRetained, want.NotRetained)
		same = false
	}
	if !sameHeader(want.Header, got.Header) {
		t.Errorf("%s: Response.Header = %v, want %v", what, got.Header, want.Header)
		same = false
	}
	// Not the whole body in the message: a 1 MiB dump is useless.
	if !bytes.Equal(want.Body, got.Body) {
		t.Errorf("%s: Response.Body is %d bytes, want %d bytes (first difference at %d)",
			what, len(got.Body), len(want.Body), firstDiff(want.Body, got.Body))
		same = false
	}
	return same
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

// requireNear checks that got is within clockTolerance of want.
func requireNear(t *testing.T, want, got time.Time, what string) {
	t.Helper()
	if d := want.Sub(got); d < -clockTolerance || d > clockTolerance {
		t.Fatalf("%s: got %v, want %v ± %v (off by %v)", what, got, want, clockTolerance, -d)
	}
}

// requireLeaseLost checks that a fenced operation was refused with core.ErrLeaseLost.
func requireLeaseLost(t *testing.T, err error, op string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: nil error, want core.ErrLeaseLost (it must be refused)", op)
	}
	if !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("%s: error %v, want core.ErrLeaseLost", op, err)
	}
}

// ------------------------------------------------------------------ claim

func testClaimFresh(t *testing.T, s core.Store) {
	req := newReq()
	res := claimNew(t, s, req)
	rec := res.Record
	if res.Now.IsZero() {
		t.Fatal("ClaimResult.Now is zero, want the store's now")
	}
	if rec.Token <= 0 {
		t.Errorf("Token = %d, want > 0", rec.Token)
	}
	for _, f := range []struct{ name, got, want string }{
		{"Status", string(rec.Status), string(storekit.StatusProcessing)},
		{"Scope", rec.Scope, req.Scope},
		{"Key", rec.Key, req.Key},
		{"Method", rec.Method, req.Method},
		{"Route", rec.Route, req.Route},
		{"Fingerprint", rec.Fingerprint, req.Fingerprint},
	} {
		if f.got != f.want {
			t.Errorf("%s = %q, want %q", f.name, f.got, f.want)
		}
	}
	if rec.Response != nil {
		t.Errorf("Response = %+v, want nil: a processing record has no response", rec.Response)
	}
	requireNear(t, res.Now.Add(req.Lease), rec.LockedUntil, "LockedUntil = Now + Lease")
	requireNear(t, res.Now.Add(req.Retention), rec.ExpiresAt, "ExpiresAt = Now + Retention")
	requireNear(t, res.Now, rec.CreatedAt, "CreatedAt = Now")

	requireSameRecord(t, rec, get(t, s, req.Scope, req.Key), "Get after Claim")
}

func testClaimTokensIncrease(t *testing.T, s core.Store) {
	var last int64
	for i := range 8 {
		res := claimNew(t, s, newReq())
		if res.Record.Token <= last {
			t.Fatalf("claim %d: token %d, want more than the previous claim's %d (tokens are strictly increasing per store)", i, res.Record.Token, last)
		}
		last = res.Record.Token
	}
}

func testClaimExistingProcessing(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)

	again := claim(t, s, req)
	if again.Claimed {
		t.Fatal("second Claim of a processing record claimed it, want not claimed: a live lease must not be taken over")
	}
	requireSameRecord(t, first.Record, again.Record, "second Claim returns the record unchanged")

	// A different request under the same key sees the original record
	// (the engine answers 422 from it), which stays unchanged.
	other := req
	other.Fingerprint = fingerprint(`{"amount":50000}`)
	mismatch := claim(t, s, other)
	if mismatch.Claimed {
		t.Fatal("Claim with another fingerprint claimed a processing record, want not claimed")
	}
	requireSameRecord(t, first.Record, mismatch.Record, "Claim with another fingerprint")

	requireSameRecord(t, first.Record, get(t, s, req.Scope, req.Key), "Get")
}

func testClaimExistingCompleted(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	resp := sampleResponse()
	complete(t, s, fence(first.Record), resp)

	want := first.Record
	want.Status = storekit.StatusCompleted
	want.Response = &resp

	again := claim(t, s, req)
	if again.Claimed {
		t.Fatal("Claim of a completed key claimed it, want not claimed: a completed record is replayed, never re-run")
	}
	requireSameRecord(t, want, again.Record, "Claim of a completed key")

	other := req
	other.Fingerprint = fingerprint(`{"amount":50000}`)
	mismatch := claim(t, s, other)
	if mismatch.Claimed {
		t.Fatal("Claim of a completed key with another fingerprint claimed it, want not claimed")
	}
	requireSameRecord(t, want, mismatch.Record, "Claim of a completed key with another fingerprint")

	requireSameRecord(t, want, get(t, s, req.Scope, req.Key), "Get")
}

func testClaimFailedTakeover(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	markFailed(t, s, fence(first.Record))

	failed := get(t, s, req.Scope, req.Key)
	if failed.Status != storekit.StatusFailed {
		t.Errorf("Status after Fail = %q, want %q", failed.Status, storekit.StatusFailed)
	}
	if failed.Token != first.Record.Token {
		t.Errorf("Token after Fail = %d, want the owner's %d", failed.Token, first.Record.Token)
	}
	if failed.Response != nil {
		t.Errorf("Response after Fail = %+v, want nil", failed.Response)
	}

	// Different durations than the first claim, so that the check below
	// sees a takeover compute both from its own request and its own now.
	req.Lease, req.Retention = 2*time.Minute, 2*time.Hour
	again := claim(t, s, req)
	if !again.Claimed {
		t.Fatalf("Claim of a failed record by the same request: not claimed (status %s), want it taken over", again.Record.Status)
	}
	rec := again.Record
	if rec.Token <= first.Record.Token {
		t.Errorf("takeover token = %d, want more than the failed owner's %d", rec.Token, first.Record.Token)
	}
	if rec.Status != storekit.StatusProcessing {
		t.Errorf("Status after takeover = %q, want %q", rec.Status, storekit.StatusProcessing)
	}
	if rec.Fingerprint != req.Fingerprint {
		t.Errorf("Fingerprint after takeover = %q, want %q", rec.Fingerprint, req.Fingerprint)
	}
	if rec.Response != nil {
		t.Errorf("Response after takeover = %+v, want nil", rec.Response)
	}
	requireNear(t, again.Now.Add(req.Lease), rec.LockedUntil, "LockedUntil = Now + Lease after takeover")
	requireNear(t, again.Now.Add(req.Retention), rec.ExpiresAt, "ExpiresAt = Now + Retention after takeover")

	requireSameRecord(t, rec, get(t, s, req.Scope, req.Key), "Get after takeover")
}

func testClaimFailedMismatch(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	markFailed(t, s, fence(first.Record))
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
		if res.Claimed {
			t.Fatalf("Claim of a failed record with another %s took it over, want not claimed", c.name)
		}
		requireSameRecord(t, want, res.Record, "Claim with another "+c.name)
	}
	requireSameRecord(t, want, get(t, s, req.Scope, req.Key), "Get")
}

func testClaimExpiredLease(t *testing.T, s core.Store) {
	req := newReq()
	req.Lease = shortLease
	first := claimNew(t, s, req)
	// Not synchronisation: the lease must lapse on the store's own clock
	// (the suite cannot move it), and what follows checks what a store
	// does with a lapsed lease.
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
		if res.Claimed {
			t.Fatalf("Claim of a lapsed lease with another %s took it over, want not claimed", c.name)
		}
		requireSameRecord(t, first.Record, res.Record, "Claim with another "+c.name)
	}

	req.Lease, req.Retention = longLease, 2*longRetention
	again := claim(t, s, req)
	if !again.Claimed {
		t.Fatalf("Claim of a lapsed lease by the same request: not claimed (status %s, locked until %v, store now %v), want it taken over",
			again.Record.Status, again.Record.LockedUntil, again.Now)
	}
	if again.Record.Token <= first.Record.Token {
		t.Errorf("takeover token = %d, want more than the lapsed owner's %d", again.Record.Token, first.Record.Token)
	}
	if again.Record.Status != storekit.StatusProcessing {
		t.Errorf("Status after takeover = %q, want %q", again.Record.Status, storekit.StatusProcessing)
	}
	requireNear(t, again.Now.Add(req.Lease), again.Record.LockedUntil, "LockedUntil = Now + Lease after takeover")
	requireNear(t, again.Now.Add(req.Retention), again.Record.ExpiresAt, "ExpiresAt = Now + Retention after takeover")

	// The new owner's lease is live: nobody else takes it over.
	third := claim(t, s, req)
	if third.Claimed {
		t.Fatal("Claim during the new owner's lease took it over, want not claimed")
	}
	requireSameRecord(t, again.Record, third.Record, "Claim during the new owner's lease")

	// The zombie cannot write; the new owner can.
	requireLeaseLost(t, s.Complete(t.Context(), fence(first.Record), sampleResponse()), "Complete by the old owner")
	requireSameRecord(t, again.Record, get(t, s, req.Scope, req.Key), "after the old owner's Complete")
	if err := s.Complete(t.Context(), fence(again.Record), sampleResponse()); err != nil {
		t.Fatalf("Complete by the new owner: %v, want nil", err)
	}
	rec := get(t, s, req.Scope, req.Key)
	if rec.Status != storekit.StatusCompleted {
		t.Errorf("Status after the new owner's Complete = %q, want %q", rec.Status, storekit.StatusCompleted)
	}
	if rec.Token != again.Record.Token {
		t.Errorf("Token after the new owner's Complete = %d, want the new owner's %d", rec.Token, again.Record.Token)
	}
}

// ------------------------------------------------------------------ fence

func testFenceStaleToken(t *testing.T, s core.Store) {
	req := newReq()
	old := claimNew(t, s, req)
	markFailed(t, s, fence(old.Record))
	cur := claimNew(t, s, req) // takeover without sleeping
	if cur.Record.Token <= old.Record.Token {
		t.Fatalf("takeover token = %d, want more than the old owner's %d", cur.Record.Token, old.Record.Token)
	}
	stale := fence(old.Record)

	requireLeaseLost(t, s.Complete(t.Context(), stale, sampleResponse()), "Complete with a stale token")
	requireLeaseLost(t, s.Fail(t.Context(), stale), "Fail with a stale token")
	requireLeaseLost(t, s.Heartbeat(t.Context(), stale, time.Hour), "Heartbeat with a stale token")
	requireSameRecord(t, cur.Record, get(t, s, req.Scope, req.Key), "after stale writes")

	// The current owner is unaffected.
	if err := s.Heartbeat(t.Context(), fence(cur.Record), longLease); err != nil {
		t.Fatalf("Heartbeat by the current owner: %v, want nil", err)
	}
	resp := sampleResponse()
	complete(t, s, fence(cur.Record), resp)
	rec := get(t, s, req.Scope, req.Key)
	if rec.Status != storekit.StatusCompleted {
		t.Errorf("Status after the current owner's Complete = %q, want %q", rec.Status, storekit.StatusCompleted)
	}
	if rec.Token != cur.Record.Token {
		t.Errorf("Token after the current owner's Complete = %d, want %d", rec.Token, cur.Record.Token)
	}
	requireSameResponse(t, &resp, rec.Response, "new owner's response")
}

func testFenceFinishedRecord(t *testing.T, s core.Store) {
	// Completed: every further write by the same owner is refused.
	req := newReq()
	res := claimNew(t, s, req)
	f := fence(res.Record)
	complete(t, s, f, sampleResponse())
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
	markFailed(t, s, f2)
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
	if _, err := s.Get(t.Context(), req.Scope, unique("key")); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get of a key never claimed: error %v, want storekit.ErrNotFound", err)
	}
}

// -------------------------------------------------------------- heartbeat

func testHeartbeatExtends(t *testing.T, s core.Store) {
	// a heartbeats right away; b's lease is left to lapse, but nobody takes
	// it over, so its owner still holds it.
	reqA, reqB := newReq(), newReq()
	reqA.Lease, reqB.Lease = 2*shortLease, shortLease
	a := claimNew(t, s, reqA)
	b := claimNew(t, s, reqB)

	if err := s.Heartbeat(t.Context(), fence(a.Record), longLease); err != nil {
		t.Fatalf("Heartbeat by the owner: %v, want nil", err)
	}
	recA := get(t, s, reqA.Scope, reqA.Key)
	if !recA.LockedUntil.After(a.Record.LockedUntil.Add(longLease / 2)) {
		t.Errorf("Heartbeat must extend LockedUntil to store now + extend: was %v, now %v, want after %v",
			a.Record.LockedUntil, recA.LockedUntil, a.Record.LockedUntil.Add(longLease/2))
	}
	if recA.Token != a.Record.Token {
		t.Errorf("Token after Heartbeat = %d, want %d: Heartbeat keeps the token", recA.Token, a.Record.Token)
	}
	if recA.Status != storekit.StatusProcessing {
		t.Errorf("Status after Heartbeat = %q, want %q", recA.Status, storekit.StatusProcessing)
	}

	// Not synchronisation: a's original lease and b's lease must lapse on
	// the store's own clock; what follows checks that the heartbeat outlived
	// the one and that the other is still owned.
	time.Sleep(lapse)

	again := claim(t, s, reqA)
	if again.Claimed {
		t.Fatal("Claim took over a heartbeated lease after its original lease lapsed, want not claimed")
	}
	if again.Record.Token != a.Record.Token {
		t.Errorf("Token of the heartbeated record = %d, want %d", again.Record.Token, a.Record.Token)
	}

	if err := s.Heartbeat(t.Context(), fence(b.Record), longLease); err != nil {
		t.Fatalf("Heartbeat of a lapsed lease nobody took over: %v, want nil (it is still owned by its token)", err)
	}
	againB := claim(t, s, reqB)
	if againB.Claimed {
		t.Fatal("Claim took over a lease the heartbeat revived, want not claimed")
	}
	complete(t, s, fence(b.Record), sampleResponse())
	if got := get(t, s, reqB.Scope, reqB.Key).Status; got != storekit.StatusCompleted {
		t.Errorf("Status after Complete = %q, want %q", got, storekit.StatusCompleted)
	}
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
	complete(t, s, fence(completed.Record), sampleResponse())
	failedReq, failed := mk(longLease)
	markFailed(t, s, fence(failed.Record))
	lapsedReq, lapsed := mk(shortLease)
	liveReq, live := mk(longLease) // processing past retention, lease still live

	// Not synchronisation: retention (and the short lease) must run out on
	// the store's own clock; expiry is what this case checks.
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
		if !res.Claimed {
			t.Fatalf("%s record past retention: Claim by another request not claimed (status %s), want claimed: the key is new again, whatever the request",
				c.name, res.Record.Status)
		}
		rec := res.Record
		if rec.Token <= maxToken {
			t.Errorf("%s: token of the new record = %d, want a fresh one larger than %d", c.name, rec.Token, maxToken)
		}
		for _, f := range []struct{ name, got, want string }{
			{"Status", string(rec.Status), string(storekit.StatusProcessing)},
			{"Method", rec.Method, req.Method},
			{"Route", rec.Route, req.Route},
			{"Fingerprint", rec.Fingerprint, req.Fingerprint},
		} {
			if f.got != f.want {
				t.Errorf("%s: %s of the new record = %q, want %q", c.name, f.name, f.got, f.want)
			}
		}
		if rec.Response != nil {
			t.Errorf("%s: Response of the new record = %+v, want nil", c.name, rec.Response)
		}
		requireNear(t, res.Now, rec.CreatedAt, c.name+": CreatedAt of the new record")
		requireNear(t, res.Now.Add(req.Retention), rec.ExpiresAt, c.name+": ExpiresAt of the new record")
		requireSameRecord(t, rec, get(t, s, req.Scope, req.Key), c.name+": Get")
	}

	other := liveReq
	other.Fingerprint = fingerprint(`{"amount":50000}`)
	res := claim(t, s, other)
	if res.Claimed {
		t.Fatal("Claim took a record held by a live lease past ExpiresAt, want not claimed: it is not expired")
	}
	requireSameRecord(t, live.Record, res.Record, "live record past retention")
	if err := s.Complete(t.Context(), fence(live.Record), sampleResponse()); err != nil {
		t.Fatalf("Complete by the live owner past retention: %v, want nil (the live owner can still complete)", err)
	}
}

// ------------------------------------------------------------------ scope

func testScopeIsolation(t *testing.T, s core.Store) {
	key := unique("key")
	reqA, reqB := newReq(), newReq()
	reqA.Key, reqB.Key = key, key
	reqB.Fingerprint = fingerprint(`{"amount":50000}`)

	a := claimNew(t, s, reqA)
	b := claim(t, s, reqB)
	if !b.Claimed {
		t.Fatalf("Claim of the same key in another scope: not claimed (found token %d), want claimed: it is another record", b.Record.Token)
	}
	if a.Record.Token == b.Record.Token {
		t.Errorf("both scopes' records have token %d, want distinct tokens", a.Record.Token)
	}
	if b.Record.Fingerprint != reqB.Fingerprint {
		t.Errorf("scope B's Fingerprint = %q, want %q", b.Record.Fingerprint, reqB.Fingerprint)
	}

	resp := sampleResponse()
	complete(t, s, fence(a.Record), resp)
	requireSameRecord(t, b.Record, get(t, s, reqB.Scope, key), "scope B after completing scope A")

	markFailed(t, s, fence(b.Record))
	recA := get(t, s, reqA.Scope, key)
	if recA.Status != storekit.StatusCompleted {
		t.Errorf("scope A's Status after failing scope B = %q, want %q", recA.Status, storekit.StatusCompleted)
	}
	requireSameResponse(t, &resp, recA.Response, "scope A after failing scope B")
	if got := get(t, s, reqB.Scope, key).Status; got != storekit.StatusFailed {
		t.Errorf("scope B's Status after Fail = %q, want %q", got, storekit.StatusFailed)
	}

	if _, err := s.Get(t.Context(), unique("scope"), key); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get of the key in a third scope: error %v, want storekit.ErrNotFound (a third scope has no record)", err)
	}
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
	if e.Record.Scope != "" {
		t.Errorf("Scope = %q, want the empty scope", e.Record.Scope)
	}
	claimNew(t, s, reqX)
	resp := sampleResponse()
	complete(t, s, fence(e.Record), resp)
	replay := claim(t, s, reqE)
	if replay.Claimed {
		t.Fatal("Claim of a completed key in the empty scope claimed it, want a replay")
	}
	requireSameResponse(t, &resp, replay.Record.Response, "replay in the empty scope")
	if got := get(t, s, reqX.Scope, reqX.Key).Status; got != storekit.StatusProcessing {
		t.Errorf("Status of the key in another scope = %q, want %q: another scope is unaffected", got, storekit.StatusProcessing)
	}
}

// --------------------------------------------------------------- response

// roundTrip completes a fresh key with resp and checks that both Get and a
// replaying Claim return it.
func roundTrip(t *testing.T, s core.Store, resp storekit.StoredResponse, want storekit.StoredResponse) {
	t.Helper()
	req := newReq()
	res := claimNew(t, s, req)
	complete(t, s, fence(res.Record), resp)

	rec := get(t, s, req.Scope, req.Key)
	if rec.Status != storekit.StatusCompleted {
		t.Fatalf("Status after Complete = %q, want %q", rec.Status, storekit.StatusCompleted)
	}
	requireSameResponse(t, &want, rec.Response, "via Get")

	replay := claim(t, s, req)
	if replay.Claimed {
		t.Fatal("Claim of a completed key claimed it, want a replay")
	}
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
	if err := s.Complete(t.Context(), fence(res.Record), resp); err != nil {
		t.Fatalf("Complete: %v, want nil: Complete must not fail on header bytes a field value cannot carry", err)
	}
	for how, r := range map[string]*storekit.StoredResponse{"via Get": get(t, s, req.Scope, req.Key).Response, "via Claim": claim(t, s, req).Record.Response} {
		if r == nil {
			t.Fatalf("%s: Response = nil, want the completed response", how)
		}
		got := r.Header["X-Odd"]
		if len(got) != len(values) {
			t.Fatalf("%s: X-Odd has %d values %q, want %d", how, len(got), got, len(values))
		}
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
	complete(t, s, fence(res.Record), resp)
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
	complete(t, s, fence(res.Record), sampleResponse())
	got := get(t, s, req.Scope, req.Key)
	replay := claim(t, s, req)
	if replay.Claimed {
		t.Fatal("Claim of a completed key claimed it, want a replay")
	}
	if replay.Record.Response == nil {
		t.Fatal("replay's Response = nil, want the completed response")
	}

	// Not synchronisation: the record must expire on the store's own clock
	// so that the key can be completed anew (the behaviour this case needs).
	time.Sleep(time.Until(start.Add(retention)) + lapse) // the key is new again
	req.Retention = longRetention
	again := claimNew(t, s, req)
	other := storekit.StoredResponse{
		Status: http.StatusAccepted,
		Header: http.Header{"Content-Type": {"text/plain"}, "Location": {"/v1/payments/pay_2"}, "Link": {"</c>"}},
		Body:   []byte(`other response, other length`),
	}
	complete(t, s, fence(again.Record), other)
	requireSameResponse(t, &other, claim(t, s, req).Record.Response, "replay of the new response")
	requireSameResponse(t, &other, get(t, s, req.Scope, req.Key).Response, "Get of the new response")

	want := sampleResponse()
	requireSameResponse(t, &want, got.Response, "a Get result, after the key was completed anew")
	requireSameResponse(t, &want, replay.Record.Response, "a Claim result, after the key was completed anew")
}

// -------------------------------------------------------------------- get

func testGetMissing(t *testing.T, s core.Store) {
	req := newReq()
	if _, err := s.Get(t.Context(), req.Scope, req.Key); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get of a key never claimed: error %v, want storekit.ErrNotFound", err)
	}

	claimNew(t, s, req)
	if _, err := s.Get(t.Context(), req.Scope, unique("key")); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get of another key in the same scope: error %v, want storekit.ErrNotFound", err)
	}
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
	// requireDone checks that an operation on the done context failed with want.
	requireDone := func(err error, op string) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("%s with a done context: error %v, want %v", op, err, want)
		}
	}

	// Nothing is created.
	fresh := newReq()
	_, err := s.Claim(ctx, fresh)
	requireDone(err, "Claim")
	if _, err = s.Get(t.Context(), fresh.Scope, fresh.Key); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get after a Claim with a done context: error %v, want storekit.ErrNotFound (the Claim must not create a record)", err)
	}

	// A claim that would take over does not.
	failedReq := newReq()
	res := claimNew(t, s, failedReq)
	markFailed(t, s, fence(res.Record))
	failed := get(t, s, failedReq.Scope, failedReq.Key)
	_, err = s.Claim(ctx, failedReq)
	requireDone(err, "Claim (takeover)")
	requireSameRecord(t, failed, get(t, s, failedReq.Scope, failedReq.Key), "failed record after Claim with a done context")

	// Fence writes do not land.
	req := newReq()
	owned := claimNew(t, s, req)
	f := fence(owned.Record)
	requireDone(s.Heartbeat(ctx, f, time.Hour), "Heartbeat")
	requireDone(s.Complete(ctx, f, sampleResponse()), "Complete")
	requireDone(s.Fail(ctx, f), "Fail")
	_, err = s.Get(ctx, req.Scope, req.Key)
	requireDone(err, "Get")
	requireSameRecord(t, owned.Record, get(t, s, req.Scope, req.Key), "record after writes with a done context")

	// And the owner still owns it.
	complete(t, s, f, sampleResponse())
}

// ------------------------------------------------------------- concurrent

// claimAll runs workers concurrent Claims of reqs(i) released together and
// returns the results; failed calls are reported and stop the test once
// all workers are done.
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
	for _, done := range ok {
		if !done {
			t.FailNow()
		}
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
	if n != 1 {
		t.Fatalf("%d of %d concurrent Claims won, want exactly 1", n, len(results))
	}
	for i, r := range results {
		if r.Record.Token != winner.Token {
			t.Errorf("worker %d saw token %d, want the winner's %d", i, r.Record.Token, winner.Token)
		}
		if r.Record.Status != storekit.StatusProcessing {
			t.Errorf("worker %d saw status %q, want %q", i, r.Record.Status, storekit.StatusProcessing)
		}
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
		if !r.Claimed {
			t.Fatalf("worker %d: a distinct key was not claimed (found a %s record, token %d), want claimed", i, r.Record.Status, r.Record.Token)
		}
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
	// Not synchronisation: the lease must lapse on the store's own clock
	// before the workers race to take it over.
	time.Sleep(lapse)
	req.Lease = longLease
	winner := requireOneWinner(t, claimAll(t, s, func(int) storekit.ClaimRequest { return req }))
	if winner.Token <= first.Record.Token {
		t.Fatalf("winner's token = %d, want more than the lapsed owner's %d", winner.Token, first.Record.Token)
	}
	requireLeaseLost(t, s.Complete(t.Context(), fence(first.Record), sampleResponse()), "Complete by the old owner")
	complete(t, s, fence(winner), sampleResponse())
}

func testConcurrentFailedTakeover(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	markFailed(t, s, fence(first.Record))
	winner := requireOneWinner(t, claimAll(t, s, func(int) storekit.ClaimRequest { return req }))
	if winner.Token <= first.Record.Token {
		t.Fatalf("winner's token = %d, want more than the failed owner's %d", winner.Token, first.Record.Token)
	}
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
	if winner < 0 {
		t.Fatalf("none of %d concurrent Completes succeeded, want one", workers)
	}
	rec := get(t, s, req.Scope, req.Key)
	if rec.Response == nil {
		t.Fatal("Response after the concurrent Completes = nil, want the winner's")
	}
	if got, want := string(rec.Response.Body), fmt.Sprintf("worker %d", winner); got != want {
		t.Errorf("stored body = %q, want the winner's %q", got, want)
	}
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
	markFailed(t, s, fence(first.Record))
	requireWoken(t, ch, "Fail")

	ch, release = w.Watch(t.Context(), req.Scope, req.Key)
	defer release()
	second := claimNew(t, s, req)
	requireWoken(t, ch, "a takeover")

	ch, release = w.Watch(t.Context(), req.Scope, req.Key)
	complete(t, s, fence(second.Record), sampleResponse())
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
