package storetest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
)

// Incarnations. A record's CreatedAt names its incarnation: it is set when
// the record is inserted, or created again once the old one expired or was
// swept, and kept by every takeover. core.RelayKey derives from it, so a
// store must hand out the very same instant (to the microsecond: what SQL
// stores keep) from the claim that created the record, from every takeover
// and from Get, and a new instant for a new record under the same key.
// Otherwise a retry would send a provider another key than the first
// attempt (a second charge), or a new payment under a reused key the old
// payment's key (the provider answers with the old charge).

var incarnationCases = []testCase{
	{"SameAcrossTakeovers", testIncarnationTakeovers},
	{"NewAfterExpiry", testIncarnationNewAfterExpiry},
	{"NewAfterSweep", testIncarnationNewAfterSweep},
}

// requireSameIncarnation compares CreatedAt exactly.
func requireSameIncarnation(t *testing.T, born time.Time, got storekit.Record, what string) {
	t.Helper()
	if !born.Equal(got.CreatedAt) {
		t.Fatalf("%s: CreatedAt %v, want the record's own %v (exactly)", what, got.CreatedAt, born)
	}
}

// requireNewIncarnation checks that a record created again carries an
// instant of its own, from the claim that created it.
func requireNewIncarnation(t *testing.T, old time.Time, res storekit.ClaimResult, what string) {
	t.Helper()
	if !res.Claimed {
		t.Fatalf("%s: not claimed (status %s, CreatedAt %v), want claimed: the key is new again", what, res.Record.Status, res.Record.CreatedAt)
	}
	if !res.Record.CreatedAt.After(old) {
		t.Fatalf("%s: CreatedAt %v, want a new one after the old record's %v", what, res.Record.CreatedAt, old)
	}
	requireNear(t, res.Now, res.Record.CreatedAt, what+": CreatedAt = Now")
}

func testIncarnationTakeovers(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	born := first.Record.CreatedAt
	requireSameIncarnation(t, born, get(t, s, req.Scope, req.Key), "Get after the claim")

	// Taken over after Fail.
	markFailed(t, s, fence(first.Record))
	requireSameIncarnation(t, born, get(t, s, req.Scope, req.Key), "Get of the failed record")
	req.Lease = shortLease
	second := claim(t, s, req)
	if !second.Claimed {
		t.Fatalf("Claim of a failed record: not claimed (status %s), want it taken over", second.Record.Status)
	}
	requireSameIncarnation(t, born, second.Record, "takeover after Fail")

	// Taken over after the lease lapsed: poll with the same request until
	// the store lets it take over (the store's clock decides).
	req.Lease = longLease
	var third storekit.ClaimResult
	deadline := time.Now().Add(wakeTimeout)
	for {
		third = claim(t, s, req)
		if third.Claimed || time.Now().After(deadline) {
			break
		}
		requireSameIncarnation(t, born, third.Record, "the record held by a live lease")
		time.Sleep(shortLease / 5) // the poll interval, not a wait for the lease
	}
	if !third.Claimed {
		t.Fatalf("Claim of a lapsed lease: not claimed within %v (locked until %v, store now %v), want it taken over",
			wakeTimeout, third.Record.LockedUntil, third.Now)
	}
	if third.Record.Token <= second.Record.Token {
		t.Fatalf("takeover token = %d, want more than the lapsed owner's %d", third.Record.Token, second.Record.Token)
	}
	requireSameIncarnation(t, born, third.Record, "takeover after the lease lapsed")
	requireSameIncarnation(t, born, get(t, s, req.Scope, req.Key), "Get after the takeovers")

	// Completed: the replay and Get still name the same incarnation.
	complete(t, s, fence(third.Record), sampleResponse())
	replay := claim(t, s, req)
	if replay.Claimed {
		t.Fatal("Claim of a completed key claimed it, want a replay")
	}
	requireSameIncarnation(t, born, replay.Record, "replay")
	requireSameIncarnation(t, born, get(t, s, req.Scope, req.Key), "Get of the completed record")
}

func testIncarnationNewAfterExpiry(t *testing.T, s core.Store) {
	mk := func(lease time.Duration) (storekit.ClaimRequest, storekit.ClaimResult) {
		req := newReq()
		req.Lease, req.Retention = lease, shortRetention
		return req, claimNew(t, s, req)
	}
	completedReq, completed := mk(longLease)
	complete(t, s, fence(completed.Record), sampleResponse())
	failedReq, failed := mk(longLease)
	markFailed(t, s, fence(failed.Record))
	lapsedReq, lapsed := mk(shortLease)
	// Not synchronisation: the records must expire on the store's own clock;
	// expiry is what this case checks.
	time.Sleep(lapse)

	// The same request as the old record's: a failed record or a lapsed
	// lease would be taken over (same incarnation) were it not expired.
	for _, c := range []struct {
		name string
		req  storekit.ClaimRequest
		old  storekit.Record
	}{
		{"completed", completedReq, completed.Record},
		{"failed", failedReq, failed.Record},
		{"processing with lapsed lease", lapsedReq, lapsed.Record},
	} {
		req := c.req
		req.Lease, req.Retention = longLease, longRetention
		res := claim(t, s, req)
		requireNewIncarnation(t, c.old.CreatedAt, res, c.name+" record past retention, same request")
		requireSameIncarnation(t, res.Record.CreatedAt, get(t, s, req.Scope, req.Key), c.name+": Get of the new record")

		// And the new incarnation is stable in its turn.
		markFailed(t, s, fence(res.Record))
		again := claim(t, s, req)
		if !again.Claimed {
			t.Fatalf("%s: Claim of the new record after Fail not claimed (status %s), want it taken over", c.name, again.Record.Status)
		}
		requireSameIncarnation(t, res.Record.CreatedAt, again.Record, c.name+": takeover of the new record")
	}
}

// sweep empties s of its expired records with storekit.Admin's Sweep, or a
// Purge such as memstore's; false when s has neither.
func sweep(t *testing.T, s core.Store) bool {
	t.Helper()
	if a, ok := storekit.As[storekit.Admin](s); ok {
		if _, err := a.Sweep(t.Context(), 1000); err != nil {
			t.Fatalf("Sweep: %v", err)
		}
		return true
	}
	if p, ok := storekit.As[interface {
		Purge(context.Context) (int, error)
	}](s); ok {
		if _, err := p.Purge(t.Context()); err != nil {
			t.Fatalf("Purge: %v", err)
		}
		return true
	}
	return false
}

func testIncarnationNewAfterSweep(t *testing.T, s core.Store) {
	req := newReq()
	req.Retention = shortRetention
	first := claimNew(t, s, req)
	complete(t, s, fence(first.Record), sampleResponse())
	// Not synchronisation: the record must expire on the store's own clock,
	// so that the sweep below may delete it.
	time.Sleep(lapse)
	if !sweep(t, s) {
		t.Skip("the store has neither storekit.Admin nor Purge: nothing sweeps it")
	}
	// A store that keeps expired records for a retention margin before its
	// sweep deletes them (pgstore, mysqlstore and sqlitestore:
	// WithRetentionMargin) must be run with that margin at zero. This case
	// fails rather than skips: a suite that passes without showing that a
	// key reused after its record was swept gets a new incarnation (and a
	// new relay key) proves nothing about it.
	if _, err := s.Get(t.Context(), req.Scope, req.Key); !errors.Is(err, storekit.ErrNotFound) {
		if err != nil {
			t.Fatalf("Get after the sweep: %v", err)
		}
		t.Fatal("the sweep kept the expired record: run this suite on a store " +
			"configured to keep expired records for no margin (e.g. WithRetentionMargin(0))")
	}
	req.Retention = longRetention
	res := claim(t, s, req)
	requireNewIncarnation(t, first.Record.CreatedAt, res, "record swept, same request")
	requireSameIncarnation(t, res.Record.CreatedAt, get(t, s, req.Scope, req.Key), "Get of the new record")
}

// ------------------------------------------------------------- relay keys

// Relay keys through the engine on this store: what a handler sends its
// provider (core.RelayKey) is the same for every attempt at one record,
// taken over after a failure or after its owner died, and another for a
// new record under the same key once the old one expired, even with the
// same body.

var relayCases = []testCase{
	{"SameAcrossTakeovers", testRelaySameAcrossTakeovers},
	{"NewAfterExpiry", testRelayNewAfterExpiry},
}

const relayLabel = "charge"

// deadOwnerStore swallows heartbeats, so that the engine's owner looks
// dead to the store: its lease lapses while its handler "runs".
type deadOwnerStore struct{ core.Store }

func (deadOwnerStore) Heartbeat(context.Context, storekit.Fence, time.Duration) error { return nil }

// Unwrap lets a store find itself behind the wrapper (storekit.As).
func (d deadOwnerStore) Unwrap() core.Store { return d.Store }

func newEngine(t *testing.T, s core.Store, opts ...core.Option) *core.Engine {
	t.Helper()
	eng, err := core.New(s, opts...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	return eng
}

// relayRequest is the engine request for (scope, key) with body.
func relayRequest(scope, key, body string) core.Request {
	return core.Request{
		Method: http.MethodPost, Route: "/v1/payments", Target: "/v1/payments", Scope: scope,
		Header: http.Header{"Idempotency-Key": {key}}, Body: strings.NewReader(body),
	}
}

// decideRelay decides req and returns the decision and, for a Proceed, its
// relay key. A Proceed left unfinished is aborted when the test ends.
func decideRelay(t *testing.T, eng *core.Engine, req core.Request) (*core.Decision, string) {
	t.Helper()
	d, err := eng.Decide(t.Context(), req)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if d.Outcome != core.Proceed {
		return d, ""
	}
	t.Cleanup(func() { _ = eng.Abort(context.Background(), d, nil) })
	relay := core.RelayKey(d.Context(t.Context()), relayLabel)
	if relay == "" {
		t.Fatal("core.RelayKey of a Proceed is empty, want a relay key")
	}
	return d, relay
}

func proceedRelay(t *testing.T, eng *core.Engine, req core.Request, what string) (*core.Decision, string) {
	t.Helper()
	d, relay := decideRelay(t, eng, req)
	if d.Outcome != core.Proceed {
		t.Fatalf("%s: outcome %v %s, want %v", what, d.Outcome, d.Problem, core.Proceed)
	}
	return d, relay
}

func commit(t *testing.T, eng *core.Engine, d *core.Decision, status int) {
	t.Helper()
	if err := eng.Commit(context.Background(), d, adapterkit.Response{Status: status, Body: []byte(`{"id":"pay_1"}`)}); err != nil {
		t.Fatalf("Commit %d: %v", status, err)
	}
}

func testRelaySameAcrossTakeovers(t *testing.T, s core.Store) {
	const body = `{"amount":1000}`
	scope, key := unique("scope"), unique("key")
	eng := newEngine(t, s, core.WithLease(longLease), core.WithRetention(longRetention))

	d, first := proceedRelay(t, eng, relayRequest(scope, key, body), "first attempt")
	commit(t, eng, d, http.StatusBadGateway) // the provider failed: retryable

	d, relay := proceedRelay(t, eng, relayRequest(scope, key, body), "retry after a failure")
	if relay != first {
		t.Errorf("relay key of the retry of a failed record = %q, want the first attempt's %q", relay, first)
	}
	commit(t, eng, d, http.StatusBadGateway)

	// An owner that dies mid-request (its heartbeats never reach the store),
	// then another instance waiting for it takes the lapsed lease over.
	dead := newEngine(t, deadOwnerStore{s}, core.WithLease(100*time.Millisecond), core.WithRetention(longRetention))
	zombie, relay := proceedRelay(t, dead, relayRequest(scope, key, body), "the owner that dies")
	if relay != first {
		t.Errorf("relay key of a takeover of a failed record by another engine = %q, want the first attempt's %q", relay, first)
	}
	waiter := newEngine(t, s, core.WithLease(longLease), core.WithRetention(longRetention), core.WithWait(2*wakeTimeout))
	d, relay = proceedRelay(t, waiter, relayRequest(scope, key, body), "takeover of the dead owner's lapsed lease")
	if relay != first {
		t.Errorf("relay key of a takeover after the owner died = %q, want the first attempt's %q", relay, first)
	}
	if err := dead.Commit(context.Background(), zombie, adapterkit.Response{Status: http.StatusCreated}); !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("the dead owner's late Commit: error %v, want core.ErrLeaseLost", err)
	}
	commit(t, waiter, d, http.StatusCreated)

	d, _ = decideRelay(t, eng, relayRequest(scope, key, body))
	if d.Outcome != core.Replay {
		t.Fatalf("outcome for the completed record = %v %s, want %v", d.Outcome, d.Problem, core.Replay)
	}
}

func testRelayNewAfterExpiry(t *testing.T, s core.Store) {
	const body = `{"amount":1000}`
	scope := unique("scope")
	failedKey, lapsedKey, doneKey := unique("key"), unique("key"), unique("key")
	// Retention far longer than the few statements between a claim and its
	// commit, so that no commit races the expiry it is followed by.
	const lease, retention = 200 * time.Millisecond, time.Second
	eng := newEngine(t, s, core.WithLease(lease), core.WithRetention(retention))
	dead := newEngine(t, deadOwnerStore{s}, core.WithLease(lease), core.WithRetention(retention))

	d, failedRelay := proceedRelay(t, eng, relayRequest(scope, failedKey, body), "failed key")
	commit(t, eng, d, http.StatusBadGateway)
	_, lapsedRelay := proceedRelay(t, dead, relayRequest(scope, lapsedKey, body), "key whose owner dies")
	// Created last, so it expires last: once it is new again, so are the others.
	d, doneRelay := proceedRelay(t, eng, relayRequest(scope, doneKey, body), "completed key")
	commit(t, eng, d, http.StatusCreated)

	var relay string
	deadline := time.Now().Add(2*wakeTimeout + retention)
	for {
		d, relay = decideRelay(t, eng, relayRequest(scope, doneKey, body))
		if d.Outcome != core.Replay || time.Now().After(deadline) {
			break
		}
		time.Sleep(retention / 20) // the poll interval, not a wait for expiry
	}
	if d.Outcome != core.Proceed {
		t.Fatalf("outcome for the completed key past retention = %v %s (after %v), want %v: it is new again",
			d.Outcome, d.Problem, 2*wakeTimeout+retention, core.Proceed)
	}
	if relay == doneRelay {
		t.Errorf("relay key of a new payment under a reused key (same body) = %q, the old payment's: want another", relay)
	}
	commit(t, eng, d, http.StatusCreated)

	d, relay = proceedRelay(t, eng, relayRequest(scope, failedKey, body), "the failed key past retention")
	if relay == failedRelay {
		t.Errorf("failed record past retention: relay key %q, the old record's: want a new one for a new record", relay)
	}
	commit(t, eng, d, http.StatusCreated)

	d, relay = proceedRelay(t, eng, relayRequest(scope, lapsedKey, body), "the dead owner's key past retention")
	if relay == lapsedRelay {
		t.Errorf("lapsed record past retention: relay key %q, the old record's: want a new one for a new record", relay)
	}
	commit(t, eng, d, http.StatusCreated)
}
