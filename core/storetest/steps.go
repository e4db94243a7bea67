package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
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
	if err != nil {
		t.Fatalf("LoadSteps by the owner: %v, want nil", err)
	}
	if got == nil {
		t.Fatal("LoadSteps returned a nil map, want an empty map when there are no steps")
	}
	return got
}

func requireSteps(t *testing.T, want map[string]string, got map[string][]byte, what string) {
	t.Helper()
	g := make(map[string]string, len(got))
	for k, v := range got {
		g[k] = string(v)
	}
	if !maps.Equal(g, want) {
		t.Fatalf("%s: steps = %q, want %q", what, g, want)
	}
}

func saveStep(t *testing.T, ss storekit.StepStore, f storekit.Fence, name, result string) {
	t.Helper()
	if err := ss.SaveStep(t.Context(), f, name, []byte(result)); err != nil {
		t.Fatalf("SaveStep(%s) by the owner: %v, want nil", name, err)
	}
}

func testStepTakeoverNotFresh(t *testing.T, s core.Store) {
	req := newReq()
	first := claimNew(t, s, req)
	markFailed(t, s, fence(first.Record))
	again := claim(t, s, req)
	if !again.Claimed {
		t.Fatalf("Claim of a failed record: not claimed (status %s), want it taken over", again.Record.Status)
	}
	if again.Fresh {
		t.Fatal("a takeover of a failed record reported Fresh, want not Fresh: its steps would be skipped")
	}

	req = newReq()
	req.Lease = shortLease
	claimNew(t, s, req)
	// Not synchronisation: the lease must lapse on the store's own clock,
	// so that the claim below is a takeover of a lapsed lease.
	time.Sleep(lapse)
	req.Lease = longLease
	again = claim(t, s, req)
	if !again.Claimed {
		t.Fatalf("Claim of a lapsed lease: not claimed (status %s, locked until %v, store now %v), want it taken over",
			again.Record.Status, again.Record.LockedUntil, again.Now)
	}
	if again.Fresh {
		t.Fatal("a takeover of a lapsed lease reported Fresh, want not Fresh")
	}

	dup := claim(t, s, req)
	if dup.Claimed {
		t.Fatal("Claim during the new owner's lease claimed it, want not claimed")
	}
	if dup.Fresh {
		t.Fatal("a Claim that did not claim reported Fresh, want not Fresh: Fresh only with Claimed")
	}
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
	if err := ss.SaveStep(t.Context(), f, "notify", buf); err != nil {
		t.Fatalf("SaveStep(notify) by the owner: %v, want nil", err)
	}
	copy(buf, "XXXXXXXX")
	got := loadSteps(t, ss, f)
	if string(got["notify"]) != "notify-1" {
		t.Fatalf("step notify = %q after the caller reused its slice, want %q: SaveStep must copy its argument", got["notify"], "notify-1")
	}
	got["notify"][0] = 'Y'
	got["other"] = []byte("x")
	if again := loadSteps(t, ss, f)["notify"]; string(again) != "notify-1" {
		t.Fatalf("step notify = %q after the caller changed a loaded map, want %q: LoadSteps must hand out copies", again, "notify-1")
	}

	// Steps do not change the record.
	rec := get(t, s, req.Scope, req.Key)
	if rec.Status != storekit.StatusProcessing {
		t.Errorf("Status after SaveStep = %q, want %q", rec.Status, storekit.StatusProcessing)
	}
	if rec.Token != f.Token {
		t.Errorf("Token after SaveStep = %d, want %d", rec.Token, f.Token)
	}
}

func testStepLimits(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	f := fence(claimNew(t, s, newReq()).Record)
	big := randomBytes(t, core.MaxStepBytes)
	name := strings.Repeat("é", storekit.MaxStepNameBytes/2) // longest name, multi-byte UTF-8
	if err := ss.SaveStep(t.Context(), f, name, big); err != nil {
		t.Fatalf("SaveStep of a MaxStepBytes result under a MaxStepNameBytes name: %v, want nil", err)
	}
	bin := binaryBody()
	if err := ss.SaveStep(t.Context(), f, "binary", bin); err != nil {
		t.Fatalf("SaveStep of a binary result: %v, want nil", err)
	}
	got := loadSteps(t, ss, f)
	if !bytes.Equal(big, got[name]) {
		t.Fatalf("large result read back as %d bytes (first difference at %d), want the %d bytes saved intact",
			len(got[name]), firstDiff(big, got[name]), len(big))
	}
	if !bytes.Equal(bin, got["binary"]) {
		t.Fatalf("binary result read back as %q, want %q", got["binary"], bin)
	}
}

func testStepFenced(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	req := newReq()
	old := fence(claimNew(t, s, req).Record)
	saveStep(t, ss, old, "charge", "ch_old")
	markFailed(t, s, old)
	cur := fence(claim(t, s, req).Record)
	if cur.Token <= old.Token {
		t.Fatalf("takeover token = %d, want more than the failed owner's %d", cur.Token, old.Token)
	}

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
	if _, err = s.Get(t.Context(), cur.Scope, unique("key")); !errors.Is(err, storekit.ErrNotFound) {
		t.Fatalf("Get of a key never claimed: error %v, want storekit.ErrNotFound (a refused SaveStep creates no record)", err)
	}
}

func testStepSurvivesTakeover(t *testing.T, s core.Store) {
	ss := stepStore(t, s)

	// After a retryable failure.
	req := newReq()
	a := fence(claimNew(t, s, req).Record)
	saveStep(t, ss, a, "reserve", "r_1")
	saveStep(t, ss, a, "charge", "ch_1")
	markFailed(t, s, a)
	b := fence(claim(t, s, req).Record)
	requireSteps(t, map[string]string{"reserve": "r_1", "charge": "ch_1"}, loadSteps(t, ss, b), "after a takeover of the failed record")
	saveStep(t, ss, b, "notify", "n_1")
	complete(t, s, b, sampleResponse())

	// After the owner died (its lease lapsed).
	req = newReq()
	req.Lease = shortLease
	a = fence(claimNew(t, s, req).Record)
	saveStep(t, ss, a, "charge", "ch_2")
	// Not synchronisation: the lease must lapse on the store's own clock,
	// so that the claim below takes over a dead owner's record.
	time.Sleep(lapse)
	req.Lease = longLease
	res := claim(t, s, req)
	if !res.Claimed {
		t.Fatalf("Claim of a lapsed lease: not claimed (status %s, locked until %v, store now %v), want it taken over",
			res.Record.Status, res.Record.LockedUntil, res.Now)
	}
	if res.Fresh {
		t.Fatal("a takeover of a lapsed lease reported Fresh, want not Fresh")
	}
	b = fence(res.Record)
	requireSteps(t, map[string]string{"charge": "ch_2"}, loadSteps(t, ss, b), "after a takeover of a lapsed lease")
}

func testStepEndsWithCompletion(t *testing.T, s core.Store) {
	ss := stepStore(t, s)
	req := newReq()
	f := fence(claimNew(t, s, req).Record)
	saveStep(t, ss, f, "charge", "ch_1")
	resp := sampleResponse()
	complete(t, s, f, resp)
	requireLeaseLost(t, ss.SaveStep(t.Context(), f, "late", []byte("x")), "SaveStep after Complete")
	_, err := ss.LoadSteps(t.Context(), f)
	requireLeaseLost(t, err, "LoadSteps after Complete")
	rec := get(t, s, req.Scope, req.Key)
	if rec.Status != storekit.StatusCompleted {
		t.Errorf("Status after Complete = %q, want %q", rec.Status, storekit.StatusCompleted)
	}
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
			markFailed(t, s, f)
		case "completed":
			complete(t, s, f, sampleResponse())
		}
		// Not synchronisation: the record (and, for "lapsed", its lease) must
		// expire on the store's own clock; expiry is what this case checks.
		time.Sleep(wait)

		// The key is new again: same request or not, no old step shows.
		req.Lease, req.Retention = longLease, longRetention
		res := claim(t, s, req)
		if !res.Claimed {
			t.Fatalf("%s: Claim past retention not claimed (status %s), want claimed: the key is new again", end, res.Record.Status)
		}
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
			markFailed(t, s, f)
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
			case !errors.Is(err, core.ErrLeaseLost):
				t.Errorf("SaveStep by stale owner %d: error %v, want core.ErrLeaseLost", o, err)
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
		// Not synchronisation: the lease must lapse on the store's own clock
		// (lapsed, still owned by its token until taken over).
		time.Sleep(lapse)

		stop := make(chan struct{})
		writing := make(chan struct{}) // closed once the old owner's first write returned
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
				if i == 0 {
					close(writing)
				}
				switch {
				case err == nil && (stopped || refusals > 0):
					t.Errorf("round %d: stale write %d landed after the takeover", round, i)
					return
				case err == nil:
					lastOK = i
				case !errors.Is(err, core.ErrLeaseLost):
					t.Errorf("round %d: stale write %d: error %v, want core.ErrLeaseLost", round, i, err)
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
		// The takeover starts once the old owner is writing, and races the
		// writes that follow.
		<-writing
		req.Lease = longLease
		res := claim(t, s, req)
		if !res.Claimed {
			t.Errorf("round %d: Claim of the lapsed lease not claimed (status %s, locked until %v, store now %v), want it taken over",
				round, res.Record.Status, res.Record.LockedUntil, res.Now)
			close(stop) // the writer must be done before the test stops
			wg.Wait()
			t.FailNow()
		}
		cur := fence(res.Record)
		// What the new owner reads right after its claim is final: no
		// stale write may land after it.
		first := loadSteps(t, ss, cur)
		close(stop)
		wg.Wait()
		if t.Failed() {
			return
		}
		if refusals <= 0 {
			t.Fatalf("round %d: %d of the old owner's writes refused, want at least one: its writes after the takeover must be refused", round, refusals)
		}
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
	if err := ss.SaveStep(ctx, f, "charge", []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("SaveStep on a cancelled context: error %v, want context.Canceled", err)
	}
	if _, err := ss.LoadSteps(ctx, f); !errors.Is(err, context.Canceled) {
		t.Fatalf("LoadSteps on a cancelled context: error %v, want context.Canceled", err)
	}
	requireSteps(t, map[string]string{}, loadSteps(t, ss, f), "a cancelled SaveStep stores nothing")
}
