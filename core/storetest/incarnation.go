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
	"github.com/idemkit/idem/internal/testkit/assert"
	"github.com/idemkit/idem/internal/testkit/require"
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
	require.True(t, born.Equal(got.CreatedAt), "%s: CreatedAt %v, want the record's own %v (exactly)", what, got.CreatedAt, born)
}

// requireNewIncarnation checks that a record created again carries an
// instant of its own, from the claim that created it.
func requireNewIncarnation(t *testing.T, old time.Time, res storekit.ClaimResult, what string) {
	t.Helper()
	require.True(t, res.Claimed, "%s: the key is new again", what)
	require.True(t, res.Record.CreatedAt.After(old), "%s: CreatedAt %v, want a new one after the old record's %v", what, res.Record.CreatedAt, old)
	requireNear(t, res.Now, res.Record.CreatedAt, what+": CreatedAt = Now")
}

func testIncarnationTakeovers(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	born := first.Record.CreatedAt
	requireSameIncarnation(t, born, get(t, s, req.Scope, req.Key), "Get after the claim")

	// Taken over after Fail.
	require.NoError(t, s.Fail(t.Context(), fence(first.Record)))
	requireSameIncarnation(t, born, get(t, s, req.Scope, req.Key), "Get of the failed record")
	req.Lease = shortLease
	second := claim(t, s, req)
	require.True(t, second.Claimed, "a failed record is taken over")
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
		time.Sleep(shortLease / 5)
	}
	require.True(t, third.Claimed, "a lapsed lease is taken over")
	require.Greater(t, third.Record.Token, second.Record.Token)
	requireSameIncarnation(t, born, third.Record, "takeover after the lease lapsed")
	requireSameIncarnation(t, born, get(t, s, req.Scope, req.Key), "Get after the takeovers")

	// Completed: the replay and Get still name the same incarnation.
	require.NoError(t, s.Complete(t.Context(), fence(third.Record), sampleResponse()))
	replay := claim(t, s, req)
	require.False(t, replay.Claimed)
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
	require.NoError(t, s.Complete(t.Context(), fence(completed.Record), sampleResponse()))
	failedReq, failed := mk(longLease)
	require.NoError(t, s.Fail(t.Context(), fence(failed.Record)))
	lapsedReq, lapsed := mk(shortLease)
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
		require.NoError(t, s.Fail(t.Context(), fence(res.Record)))
		again := claim(t, s, req)
		require.True(t, again.Claimed)
		requireSameIncarnation(t, res.Record.CreatedAt, again.Record, c.name+": takeover of the new record")
	}
}

// sweep empties s of its expired records with storekit.Admin's Sweep, or a
// Purge such as memstore's; false when s has neither.
func sweep(t *testing.T, s core.Store) bool {
	t.Helper()
	if a, ok := storekit.As[storekit.Admin](s); ok {
		_, err := a.Sweep(t.Context(), 1000)
		require.NoError(t, err, "Sweep")
		return true
	}
	if p, ok := storekit.As[interface {
		Purge(context.Context) (int, error)
	}](s); ok {
		_, err := p.Purge(t.Context())
		require.NoError(t, err, "Purge")
		return true
	}
	return false
}

func testIncarnationNewAfterSweep(t *testing.T, s core.Store) {
	req := newReq()
	req.Retention = shortRetention
	first := claimNew(t, s, req)
	require.NoError(t, s.Complete(t.Context(), fence(first.Record), sampleResponse()))
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
		require.NoError(t, err, "Get after the sweep")
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
	require.NoError(t, err)
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
	require.NoError(t, err, "Decide")
	if d.Outcome != core.Proceed {
		return d, ""
	}
	t.Cleanup(func() { _ = eng.Abort(context.Background(), d, nil) })
	relay := core.RelayKey(d.Context(t.Context()), relayLabel)
	require.NotEmpty(t, relay)
	return d, relay
}

func proceedRelay(t *testing.T, eng *core.Engine, req core.Request, what string) (*core.Decision, string) {
	t.Helper()
	d, relay := decideRelay(t, eng, req)
	require.Equal(t, core.Proceed, d.Outcome, "%s: %v %s", what, d.Outcome, d.Problem)
	return d, relay
}

func commit(t *testing.T, eng *core.Engine, d *core.Decision, status int) {
	t.Helper()
	require.NoError(t, eng.Commit(context.Background(), d, adapterkit.Response{Status: status, Body: []byte(`{"id":"pay_1"}`)}), "Commit %d", status)
}

func testRelaySameAcrossTakeovers(t *testing.T, s core.Store) {
	const body = `{"amount":1000}`
	scope, key := unique("scope"), unique("key")
	eng := newEngine(t, s, core.WithLease(longLease), core.WithRetention(longRetention))

	d, first := proceedRelay(t, eng, relayRequest(scope, key, body), "first attempt")
	commit(t, eng, d, http.StatusBadGateway) // the provider failed: retryable

	d, relay := proceedRelay(t, eng, relayRequest(scope, key, body), "retry after a failure")
	assert.Equal(t, first, relay, "the retry of a failed record sends the provider the first attempt's key")
	commit(t, eng, d, http.StatusBadGateway)

	// An owner that dies mid-request (its heartbeats never reach the store),
	// then another instance waiting for it takes the lapsed lease over.
	dead := newEngine(t, deadOwnerStore{s}, core.WithLease(100*time.Millisecond), core.WithRetention(longRetention))
	zombie, relay := proceedRelay(t, dead, relayRequest(scope, key, body), "the owner that dies")
	assert.Equal(t, first, relay, "a takeover of a failed record, by another engine")
	waiter := newEngine(t, s, core.WithLease(longLease), core.WithRetention(longRetention), core.WithWait(2*wakeTimeout))
	d, relay = proceedRelay(t, waiter, relayRequest(scope, key, body), "takeover of the dead owner's lapsed lease")
	assert.Equal(t, first, relay, "a takeover after the owner died sends the provider the first attempt's key")
	require.ErrorIs(t, dead.Commit(context.Background(), zombie, adapterkit.Response{Status: http.StatusCreated}), core.ErrLeaseLost,
		"the dead owner's late commit")
	commit(t, waiter, d, http.StatusCreated)

	d, _ = decideRelay(t, eng, relayRequest(scope, key, body))
	require.Equal(t, core.Replay, d.Outcome, "the completed record replays")
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
		time.Sleep(retention / 20)
	}
	require.Equal(t, core.Proceed, d.Outcome, "the completed key, past retention, is new again")
	assert.NotEqual(t, doneRelay, relay, "a new payment under a reused key (same body) must not send the old payment's relay key")
	commit(t, eng, d, http.StatusCreated)

	d, relay = proceedRelay(t, eng, relayRequest(scope, failedKey, body), "the failed key past retention")
	assert.NotEqual(t, failedRelay, relay, "failed record past retention: a new record, a new relay key")
	commit(t, eng, d, http.StatusCreated)

	d, relay = proceedRelay(t, eng, relayRequest(scope, lapsedKey, body), "the dead owner's key past retention")
	assert.NotEqual(t, lapsedRelay, relay, "lapsed record past retention: a new record, a new relay key")
	commit(t, eng, d, http.StatusCreated)
}
