package storetest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/internal/testkit/assert"
	"github.com/idemkit/idem/internal/testkit/require"
)

// stepCases check the optional storekit.StepStore capability (recovery points).
// They skip for stores without it, except TakeoverNotFresh, which pins a
// rule of storekit.ClaimResult every store must keep.
var stepCases = []testCase{
	{"TakeoverNotFresh", testStepTakeoverNotFresh},
	{"SaveAndLoad", testStepSaveAndLoad},
	{"Limits", testStepLimits},
	{"Fenced", testStepFenced},
	{"SurvivesTakeover", testStepSurvivesTakeover},
	{"EndsWithCompletion", testStepEndsWithCompletion},
	{"ExpiresWithRecord", testStepExpiresWithRecord},
	{"ScopeIsolation", testStepScopeIsolation},
	{"ConcurrentOwners", testStepConcurrentOwners},
	{"RacesTakeover", testStepRacesTakeover},
	{"Context", testStepContext},
}

// stepStore returns s as a storekit.StepStore, skipping the test when s is not
// one (the capability is optional).
func stepStore(t *testing.T, s core.Store) storekit.StepStore {
	t.Helper()
	ss, ok := s.(storekit.StepStore)
	if !ok {
		t.Skip("store does not implement storekit.StepStore")
	}
	return ss
}

func loadSteps(t *testing.T, ss storekit.StepStore, f storekit.Fence) map[string][]byte {
	t.Helper()
	got, err := ss.LoadSteps(t.Context(), f)
	require.NoError(t, err, "LoadSteps by the owner")
	require.NotNil(t, got, "LoadSteps returns an empty map, not nil, when there are no steps")
	return got
}

func requireSteps(t *testing.T, want map[string]string, got map[string][]byte, what string) {
	t.Helper()
	g := make(map[string]string, len(got))
	for k, v := range got {
		g[k] = string(v)
	}
	require.Equal(t, want, g, "%s", what)
}

func saveStep(t *testing.T, ss storekit.StepStore, f storekit.Fence, name, result string) {
	t.Helper()
	require.NoError(t, ss.SaveStep(t.Context(), f, name, []byte(result)), "SaveStep(%s) by the owner", name)
}

func testStepTakeoverNotFresh(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	require.NoError(t, s.Fail(t.Context(), fence(first.Record)))
	again := claim(t, s, req)
	require.True(t, again.Claimed)
	require.False(t, again.Fresh, "a takeover of a failed record must not report Fresh: its steps would be skipped")

	req = newReq()
	req.Lease = shortLease
	claimNew(t, s, req)
	time.Sleep(lapse)
	req.Lease = longLease
	again = claim(t, s, req)
	require.True(t, again.Claimed)
	require.False(t, again.Fresh, "a takeover of a lapsed lease must not report Fresh")

	dup := claim(t, s, req)
	require.False(t, dup.Claimed)
	require.False(t, dup.Fresh, "Fresh only with Claimed")
}

func testStepSaveAndLoad(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	req := newReq()
	f := fence(claimNew(t, s, req).Record)
	requireSteps(t, map[string]string{}, loadSteps(t, ss, f), "a new record has no steps")

	saveStep(t, ss, f, "reserve", `{"reservation":"r_1"}`)
	saveStep(t, ss, f, "charge", "ch_1")
	saveStep(t, ss, f, "empty", "")
	requireSteps(t, map[string]string{"reserve": `{"reservation":"r_1"}`, "charge": "ch_1", "empty": ""},
		loadSteps(t, ss, f), "after three steps")

	// Saving a name again replaces its result (the engine never does it
	// within one execution, but a store must not keep two).
	saveStep(t, ss, f, "charge", "ch_2")
	requireSteps(t, map[string]string{"reserve": `{"reservation":"r_1"}`, "charge": "ch_2", "empty": ""},
		loadSteps(t, ss, f), "after replacing one")

	// The store keeps copies: the caller may reuse its slices.
	buf := []byte("notify-1")
	require.NoError(t, ss.SaveStep(t.Context(), f, "notify", buf))
	copy(buf, "XXXXXXXX")
	got := loadSteps(t, ss, f)
	require.Equal(t, "notify-1", string(got["notify"]), "SaveStep must copy its argument")
	got["notify"][0] = 'Y'
	got["other"] = []byte("x")
	require.Equal(t, "notify-1", string(loadSteps(t, ss, f)["notify"]), "LoadSteps must hand out copies")

	// Steps do not change the record.
	rec := get(t, s, req.Scope, req.Key)
	assert.Equal(t, storekit.StatusProcessing, rec.Status)
	assert.Equal(t, f.Token, rec.Token)
}

func testStepLimits(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	f := fence(claimNew(t, s, newReq()).Record)
	big := randomBytes(t, core.MaxStepBytes)
	name := strings.Repeat("é", core.MaxStepNameBytes/2) // longest name, multi-byte UTF-8
	require.NoError(t, ss.SaveStep(t.Context(), f, name, big), "a MaxStepBytes result under a MaxStepNameBytes name")
	bin := binaryBody()
	require.NoError(t, ss.SaveStep(t.Context(), f, "binary", bin))
	got := loadSteps(t, ss, f)
	require.True(t, bytes.Equal(big, got[name]), "large result read back intact")
	require.True(t, bytes.Equal(bin, got["binary"]), "binary result read back intact")
}

func testStepFenced(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	req := newReq()
	old := fence(claimNew(t, s, req).Record)
	saveStep(t, ss, old, "charge", "ch_old")
	require.NoError(t, s.Fail(t.Context(), old))
	cur := fence(claim(t, s, req).Record)
	require.Greater(t, cur.Token, old.Token)

	// The stale owner can neither overwrite nor add a step, nor read.
	requireLeaseLost(t, ss.SaveStep(t.Context(), old, "charge", []byte("ch_zombie")), "SaveStep by a stale owner (existing name)")
	requireLeaseLost(t, ss.SaveStep(t.Context(), old, "notify", []byte("zombie")), "SaveStep by a stale owner (new name)")
	_, err := ss.LoadSteps(t.Context(), old)
	requireLeaseLost(t, err, "LoadSteps by a stale owner")
	requireSteps(t, map[string]string{"charge": "ch_old"}, loadSteps(t, ss, cur), "stale writes changed nothing")

	// Unknown key, unknown token, other scope: refused.
	for _, f := range []storekit.Fence{
		{Scope: cur.Scope, Key: unique("key"), Token: cur.Token},
		{Scope: cur.Scope, Key: cur.Key, Token: cur.Token + 1000},
		{Scope: unique("scope"), Key: cur.Key, Token: cur.Token},
	} {
		requireLeaseLost(t, ss.SaveStep(t.Context(), f, "charge", []byte("x")), fmt.Sprintf("SaveStep with fence %+v", f))
		_, err := ss.LoadSteps(t.Context(), f)
		requireLeaseLost(t, err, fmt.Sprintf("LoadSteps with fence %+v", f))
	}
	requireSteps(t, map[string]string{"charge": "ch_old"}, loadSteps(t, ss, cur), "refused writes changed nothing")
	_, err = s.Get(t.Context(), cur.Scope, unique("key"))
	require.ErrorIs(t, err, storekit.ErrNotFound, "a refused SaveStep creates no record")
}

func testStepSurvivesTakeover(t *testing.T, s core.Store) {
	ss := stepStore(t, s)

	// After a retryable failure.
	req := newReq()
	a := fence(claimNew(t, s, req).Record)
	saveStep(t, ss, a, "reserve", "r_1")
	saveStep(t, ss, a, "charge", "ch_1")
	require.NoError(t, s.Fail(t.Context(), a))
	b := fence(claim(t, s, req).Record)
	requireSteps(t, map[string]string{"reserve": "r_1", "charge": "ch_1"}, loadSteps(t, ss, b), "after a takeover of the failed record")
	saveStep(t, ss, b, "notify", "n_1")
	require.NoError(t, s.Complete(t.Context(), b, sampleResponse()))

	// After the owner died (its lease lapsed).
	req = newReq()
	req.Lease = shortLease
	a = fence(claimNew(t, s, req).Record)
	saveStep(t, ss, a, "charge", "ch_2")
	time.Sleep(lapse)
	req.Lease = longLease
	res := claim(t, s, req)
	require.True(t, res.Claimed)
	require.False(t, res.Fresh)
	b = fence(res.Record)
	requireSteps(t, map[string]string{"charge": "ch_2"}, loadSteps(t, ss, b), "after a takeover of a lapsed lease")
}

func testStepEndsWithCompletion(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	req := newReq()
	f := fence(claimNew(t, s, req).Record)
	saveStep(t, ss, f, "charge", "ch_1")
	resp := sampleResponse()
	require.NoError(t, s.Complete(t.Context(), f, resp))
	requireLeaseLost(t, ss.SaveStep(t.Context(), f, "late", []byte("x")), "SaveStep after Complete")
	_, err := ss.LoadSteps(t.Context(), f)
	requireLeaseLost(t, err, "LoadSteps after Complete")
	rec := get(t, s, req.Scope, req.Key)
	assert.Equal(t, storekit.StatusCompleted, rec.Status)
	requireSameResponse(t, &resp, rec.Response, "the completed response")
}

func testStepExpiresWithRecord(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	for _, end := range []string{"failed", "completed", "lapsed"} {
		req := newReq()
		req.Retention = shortRetention
		lease, wait := longLease, lapse
		if end == "lapsed" {
			// Long enough for the two saves below on a loaded machine (a 50 ms lease lapsed
			// between them in a make test run at load 12), then waited out.
			lease = 750 * time.Millisecond
			wait = lease + lapse
		}
		req.Lease = lease
		f := fence(claimNew(t, s, req).Record)
		saveStep(t, ss, f, "charge", "ch_old")
		saveStep(t, ss, f, "reserve", "r_old")
		switch end {
		case "failed":
			require.NoError(t, s.Fail(t.Context(), f))
		case "completed":
			require.NoError(t, s.Complete(t.Context(), f, sampleResponse()))
		}
		time.Sleep(wait)

		// The key is new again: same request or not, no old step shows.
		req.Lease, req.Retention = longLease, longRetention
		res := claim(t, s, req)
		require.True(t, res.Claimed, "%s: the key is new again past retention", end)
		g := fence(res.Record)
		requireSteps(t, map[string]string{}, loadSteps(t, ss, g), end+": a key new again has no steps")
		saveStep(t, ss, g, "charge", "ch_new")
		requireSteps(t, map[string]string{"charge": "ch_new"}, loadSteps(t, ss, g), end+": only the new incarnation's steps")
		if end == "lapsed" {
			requireLeaseLost(t, ss.SaveStep(t.Context(), f, "charge", []byte("ch_zombie")), "SaveStep by the expired owner")
			requireSteps(t, map[string]string{"charge": "ch_new"}, loadSteps(t, ss, g), "after the expired owner's write")
		}
	}
}

func testStepScopeIsolation(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	key := unique("key")
	reqA, reqB := newReq(), newReq()
	reqA.Key, reqB.Key = key, key
	a := fence(claimNew(t, s, reqA).Record)
	b := fence(claimNew(t, s, reqB).Record)
	saveStep(t, ss, a, "charge", "ch_a")
	requireSteps(t, map[string]string{}, loadSteps(t, ss, b), "scope B after scope A's step")
	saveStep(t, ss, b, "charge", "ch_b")
	requireSteps(t, map[string]string{"charge": "ch_a"}, loadSteps(t, ss, a), "scope A")
	requireSteps(t, map[string]string{"charge": "ch_b"}, loadSteps(t, ss, b), "scope B")
	// A's token on B's record: refused.
	requireLeaseLost(t, ss.SaveStep(t.Context(), storekit.Fence{Scope: reqB.Scope, Key: key, Token: a.Token}, "charge", []byte("x")),
		"SaveStep with another scope's token")

	// A store that joins scope and key with a separator would confuse these.
	p := unique("p")
	reqC, reqD := newReq(), newReq()
	reqC.Scope, reqC.Key = p+"a", "b:c"
	reqD.Scope, reqD.Key = p+"a:b", "c"
	c := fence(claimNew(t, s, reqC).Record)
	d := fence(claimNew(t, s, reqD).Record)
	saveStep(t, ss, c, "charge", "ch_c")
	requireSteps(t, map[string]string{}, loadSteps(t, ss, d), "a scope/key pair that concatenates alike")
}

// testStepConcurrentOwners: every owner the key ever had writes the same
// step at once; only the current owner's writes land.
func testStepConcurrentOwners(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	req := newReq()
	const owners = 8
	var fences []storekit.Fence
	for i := range owners {
		f := fence(claim(t, s, req).Record)
		fences = append(fences, f)
		if i < owners-1 {
			require.NoError(t, s.Fail(t.Context(), f))
		}
	}
	cur := fences[owners-1]
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		mu     sync.Mutex
		landed = map[int]int{}
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := w % owners
			<-start
			err := ss.SaveStep(t.Context(), fences[o], "charge", fmt.Appendf(nil, "owner %d", o))
			switch {
			case err == nil:
				mu.Lock()
				landed[o]++
				mu.Unlock()
			case o == owners-1:
				t.Errorf("SaveStep by the current owner: %v", err)
			default:
				if !assert.ErrorIs(t, err, core.ErrLeaseLost, "SaveStep by stale owner %d", o) {
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	for o, n := range landed {
		if o != owners-1 {
			t.Errorf("stale owner %d: %d step writes landed, want none", o, n)
		}
	}
	requireSteps(t, map[string]string{"charge": fmt.Sprintf("owner %d", owners-1)}, loadSteps(t, ss, cur), "after the concurrent writes")
}

// testStepRacesTakeover: an owner keeps writing steps while another request
// takes its lapsed lease over. Every write that landed did so before the
// takeover: the new owner sees the last of them (or none), and nothing the
// old owner wrote after the takeover.
func testStepRacesTakeover(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	for round := range 3 {
		req := newReq()
		req.Lease = shortLease
		old := fence(claimNew(t, s, req).Record)
		time.Sleep(lapse) // lapsed, still owned by its token until taken over

		stop := make(chan struct{})
		var (
			wg       sync.WaitGroup
			lastOK   = -1
			refusals int
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000; i++ {
				stopped := false
				select {
				case <-stop: // the takeover is done: this write must be refused
					stopped = true
				default:
				}
				err := ss.SaveStep(t.Context(), old, "charge", fmt.Appendf(nil, "old %d", i))
				switch {
				case err == nil && (stopped || refusals > 0):
					t.Errorf("round %d: stale write %d landed after the takeover", round, i)
					return
				case err == nil:
					lastOK = i
				case !assert.ErrorIs(t, err, core.ErrLeaseLost, "round %d: stale write", round):
					return
				default:
					refusals++
					if stopped || refusals >= 3 {
						return
					}
				}
			}
			t.Errorf("round %d: the old owner's writes were never refused", round)
		}()
		time.Sleep(5 * time.Millisecond)
		req.Lease = longLease
		res := claim(t, s, req)
		require.True(t, res.Claimed, "round %d: takeover", round)
		cur := fence(res.Record)
		// What the new owner reads right after its claim is final: no
		// stale write may land after it.
		first := loadSteps(t, ss, cur)
		close(stop)
		wg.Wait()
		if t.Failed() {
			return
		}
		require.Positive(t, refusals, "round %d: the old owner's writes after the takeover must be refused", round)
		want := map[string]string{}
		if lastOK >= 0 {
			want["charge"] = fmt.Sprintf("old %d", lastOK)
		}
		requireSteps(t, want, first, fmt.Sprintf("round %d: new owner's view right after the takeover", round))
		requireSteps(t, want, loadSteps(t, ss, cur), fmt.Sprintf("round %d: new owner's view after the old owner stopped", round))
	}
}

func testStepContext(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	f := fence(claimNew(t, s, newReq()).Record)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, ss.SaveStep(ctx, f, "charge", []byte("x")), context.Canceled, "SaveStep on a cancelled context")
	_, err := ss.LoadSteps(ctx, f)
	require.ErrorIs(t, err, context.Canceled, "LoadSteps on a cancelled context")
	requireSteps(t, map[string]string{}, loadSteps(t, ss, f), "a cancelled SaveStep stores nothing")
}
