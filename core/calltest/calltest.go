package calltest

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// NewStore returns a fresh, empty store for one test.
type NewStore func(t testing.TB) core.Store

// Run runs the in-process conformance suite of Engine.Call on stores made
// by newStore.
func Run(t *testing.T, newStore NewStore) {
	t.Run("OnceThenReplay", func(t *testing.T) { onceThenReplay(t, newStore(t)) })
	t.Run("JSON", func(t *testing.T) { callJSON(t, newStore(t)) })
	t.Run("ConcurrentDuplicates", func(t *testing.T) { concurrentDuplicates(t, newStore(t)) })
	t.Run("InFlight", func(t *testing.T) { inFlight(t, newStore(t)) })
	t.Run("Mismatch", func(t *testing.T) { mismatch(t, newStore(t)) })
	t.Run("ErrorReleases", func(t *testing.T) { errorReleases(t, newStore(t)) })
	t.Run("PanicReleases", func(t *testing.T) { panicReleases(t, newStore(t)) })
	t.Run("BadRequests", func(t *testing.T) { badRequests(t, newStore(t)) })
	t.Run("StoreUnavailable", func(t *testing.T) { storeUnavailable(t, newStore(t)) })
	t.Run("TakeoverFencesOldOwner", func(t *testing.T) { takeoverFences(t, newStore(t)) })
	t.Run("Steps", func(t *testing.T) { steps(t, newStore(t)) })
	t.Run("Nested", func(t *testing.T) { nested(t, newStore(t)) })
	t.Run("Limits", func(t *testing.T) { limits(t, newStore(t)) })
}

const scope = "tenant-a"

func engine(t testing.TB, s core.Store, opts ...core.Option) *core.Engine {
	t.Helper()
	e, err := core.New(s, opts...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	return e
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func req(key string, input string) core.CallRequest {
	return core.CallRequest{Scope: scope, Key: key, Name: "charge", Input: []byte(input)}
}

func onceThenReplay(t *testing.T, s core.Store) {
	e := engine(t, s)
	var runs atomic.Int32
	fn := func(ctx context.Context) ([]byte, error) {
		if _, ok := storekit.LeaseFromContext(ctx); !ok {
			t.Errorf("fn's context carries no lease")
		}
		runs.Add(1)
		return []byte("charged 42"), nil
	}
	first, err := e.Call(ctx(t), req("k1", "42"), fn)
	if err != nil || first.Replayed || string(first.Value) != "charged 42" {
		t.Fatalf("first call = %+v, %v; want fresh result", first, err)
	}
	second, err := e.Call(ctx(t), req("k1", "42"), fn)
	if err != nil || !second.Replayed || string(second.Value) != "charged 42" {
		t.Fatalf("retry = %+v, %v; want replayed result", second, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	// Another key, or the same key in another scope, is another call.
	other := req("k1", "42")
	other.Scope = "tenant-b"
	if r, err := e.Call(ctx(t), other, fn); err != nil || r.Replayed {
		t.Fatalf("same key, other scope = %+v, %v; want a fresh run", r, err)
	}
	rec, err := s.Get(ctx(t), scope, "k1")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if rec.Method != storekit.CallMethod || rec.Route != "charge" || rec.Status != storekit.StatusCompleted {
		t.Fatalf("record = method %q route %q status %v; want CALL, charge, completed", rec.Method, rec.Route, rec.Status)
	}
}

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func callJSON(t *testing.T, s core.Store) {
	e := engine(t, s)
	runs := 0
	fn := func(context.Context) (receipt, error) {
		runs++
		return receipt{ID: "ch_" + strconv.Itoa(runs), Amount: 42}, nil
	}
	a, err := core.CallJSON(ctx(t), e, req("kj", "42"), fn)
	if err != nil {
		t.Fatal(err)
	}
	b, err := core.CallJSON(ctx(t), e, req("kj", "42"), fn)
	if err != nil {
		t.Fatal(err)
	}
	if a != b || a != (receipt{ID: "ch_1", Amount: 42}) || runs != 1 {
		t.Fatalf("first %+v, retry %+v, %d runs; want one run replayed", a, b, runs)
	}
}

func concurrentDuplicates(t *testing.T, s core.Store) {
	const engines, perEngine, keys = 3, 4, 3
	var es []*core.Engine
	for range engines {
		es = append(es, engine(t, s, core.WithWait(20*time.Second)))
	}
	var mu sync.Mutex
	runs := map[string]int{}
	results := map[string]map[string]bool{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for k := range keys {
		key := "dup-" + strconv.Itoa(k)
		for i, e := range es {
			for j := range perEngine {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					res, err := e.Call(ctx(t), req(key, "in-"+key), func(context.Context) ([]byte, error) {
						mu.Lock()
						runs[key]++
						mu.Unlock()
						return []byte(fmt.Sprintf("%s by %d/%d", key, i, j)), nil
					})
					if err != nil {
						t.Errorf("%s: %v", key, err)
						return
					}
					mu.Lock()
					if results[key] == nil {
						results[key] = map[string]bool{}
					}
					results[key][string(res.Value)] = true
					mu.Unlock()
				}()
			}
		}
	}
	close(start)
	wg.Wait()
	for k := range keys {
		key := "dup-" + strconv.Itoa(k)
		if runs[key] != 1 || len(results[key]) != 1 {
			t.Errorf("%s: fn ran %d times, callers saw %d results; want 1 and 1", key, runs[key], len(results[key]))
		}
	}
}

func inFlight(t *testing.T, s core.Store) {
	e := engine(t, s, core.WithRetryAfter(3*time.Second))
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Call(ctx(t), req("kf", "1"), func(context.Context) ([]byte, error) {
			close(started)
			<-release
			return []byte("ok"), nil
		})
		done <- err
	}()
	<-started
	_, err := e.Call(ctx(t), req("kf", "1"), func(context.Context) ([]byte, error) {
		t.Errorf("duplicate ran while the first was in flight")
		return nil, nil
	})
	var ce *core.CallError
	if !errors.Is(err, core.ErrInFlight) || !errors.As(err, &ce) || ce.RetryAfter <= 0 || ce.RetryAfter > 3*time.Second {
		t.Errorf("duplicate in flight: %v (%+v); want ErrInFlight with RetryAfter in (0, 3s]", err, ce)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("owner: %v", err)
	}
	// With a wait, a duplicate waits for the owner and gets its result.
	w := engine(t, s, core.WithWait(10*time.Second))
	started2, release2 := make(chan struct{}), make(chan struct{})
	go func() {
		_, err := w.Call(ctx(t), req("kw", "1"), func(context.Context) ([]byte, error) {
			close(started2)
			<-release2
			return []byte("waited"), nil
		})
		done <- err
	}()
	<-started2
	got := make(chan core.CallResult, 1)
	go func() {
		r, err := w.Call(ctx(t), req("kw", "1"), func(context.Context) ([]byte, error) {
			t.Errorf("waiting duplicate ran")
			return nil, nil
		})
		if err != nil {
			t.Errorf("waiting duplicate: %v", err)
		}
		got <- r
	}()
	close(release2)
	if err := <-done; err != nil {
		t.Fatalf("owner: %v", err)
	}
	if r := <-got; !r.Replayed || string(r.Value) != "waited" {
		t.Fatalf("waiting duplicate = %+v; want the owner's result, replayed", r)
	}
}

func mismatch(t *testing.T, s core.Store) {
	e := engine(t, s)
	ok := func(context.Context) ([]byte, error) { return []byte("x"), nil }
	if _, err := e.Call(ctx(t), req("km", "amount=1"), ok); err != nil {
		t.Fatal(err)
	}
	never := func(context.Context) ([]byte, error) {
		t.Errorf("fn ran under a reused key")
		return nil, nil
	}
	if _, err := e.Call(ctx(t), req("km", "amount=2"), never); !errors.Is(err, core.ErrMismatch) {
		t.Errorf("other input: %v; want ErrMismatch", err)
	}
	other := req("km", "amount=1")
	other.Name = "refund"
	if _, err := e.Call(ctx(t), other, never); !errors.Is(err, core.ErrMismatch) {
		t.Errorf("other name: %v; want ErrMismatch", err)
	}
}

var errDeclinedTemporarily = errors.New("provider timeout")

func errorReleases(t *testing.T, s core.Store) {
	e := engine(t, s)
	runs := 0
	fn := func(context.Context) ([]byte, error) {
		runs++
		if runs == 1 {
			return nil, errDeclinedTemporarily
		}
		return []byte("second try"), nil
	}
	if _, err := e.Call(ctx(t), req("ke", "1"), fn); !errors.Is(err, errDeclinedTemporarily) {
		t.Fatalf("first call: %v; want fn's error", err)
	}
	r, err := e.Call(ctx(t), req("ke", "1"), fn)
	if err != nil || r.Replayed || string(r.Value) != "second try" || runs != 2 {
		t.Fatalf("retry = %+v, %v after %d runs; want fn to run again", r, err, runs)
	}
}

func panicReleases(t *testing.T, s core.Store) {
	e := engine(t, s)
	_, err := e.Call(ctx(t), req("kp", "1"), func(context.Context) ([]byte, error) { panic("boom") })
	var ce *core.CallError
	if !errors.As(err, &ce) || ce.Problem != problem.HandlerPanic {
		t.Fatalf("panicking fn: %v; want CallError handler-panic", err)
	}
	r, err := e.Call(ctx(t), req("kp", "1"), func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || r.Replayed {
		t.Fatalf("retry after panic = %+v, %v; want a fresh run", r, err)
	}
}

func badRequests(t *testing.T, s core.Store) {
	e := engine(t, s)
	never := func(context.Context) ([]byte, error) {
		t.Errorf("fn ran for a refused call")
		return nil, nil
	}
	for _, c := range []struct {
		name string
		req  core.CallRequest
		want error
	}{
		{"no key", core.CallRequest{Scope: scope, Name: "charge"}, core.ErrKeyMissing},
		{"bad key", core.CallRequest{Scope: scope, Key: "a b", Name: "charge"}, core.ErrKeyInvalid},
		{"quoted key", core.CallRequest{Scope: scope, Key: `"ab"`, Name: "charge"}, core.ErrKeyInvalid},
		{"no scope", core.CallRequest{Key: "k", Name: "charge"}, core.ErrNoScope},
	} {
		if _, err := e.Call(ctx(t), c.req, never); !errors.Is(err, c.want) {
			t.Errorf("%s: %v; want %v", c.name, err, c.want)
		}
	}
	if _, err := e.Call(ctx(t), core.CallRequest{Scope: scope, Key: "k", Name: "POST /x"}, never); err == nil {
		t.Errorf("a name that is not canonical was accepted")
	}
}

// downStore fails every claim, as an unreachable database does.
type downStore struct{ core.Store }

var errDown = errors.New("connection refused")

func (downStore) Claim(context.Context, storekit.ClaimRequest) (storekit.ClaimResult, error) {
	return storekit.ClaimResult{}, errDown
}

func storeUnavailable(t *testing.T, s core.Store) {
	e := engine(t, downStore{s})
	_, err := e.Call(ctx(t), req("ku", "1"), func(context.Context) ([]byte, error) {
		t.Errorf("fn ran without a claim")
		return nil, nil
	})
	if !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, errDown) {
		t.Fatalf("store down: %v; want ErrStoreUnavailable wrapping the store's error", err)
	}
}

// deafStore acknowledges heartbeats without renewing the lease: its owner
// looks alive to itself and dead to everyone else, as a paused process does.
type deafStore struct{ core.Store }

func (deafStore) Heartbeat(context.Context, storekit.Fence, time.Duration) error { return nil }

func takeoverFences(t *testing.T, s core.Store) {
	stale := engine(t, deafStore{s}, core.WithLease(300*time.Millisecond))
	fresh := engine(t, s, core.WithLease(5*time.Second), core.WithWait(10*time.Second))
	started, release := make(chan struct{}), make(chan struct{})
	relays := make(chan string, 2)
	done := make(chan error, 1)
	go func() {
		_, err := stale.Call(ctx(t), req("kt", "1"), func(ctx context.Context) ([]byte, error) {
			relays <- core.RelayKey(ctx, "provider")
			close(started)
			<-release
			return []byte("stale"), nil
		})
		done <- err
	}()
	<-started
	r, err := fresh.Call(ctx(t), req("kt", "1"), func(ctx context.Context) ([]byte, error) {
		relays <- core.RelayKey(ctx, "provider")
		return []byte("taken over"), nil
	})
	if err != nil || r.Replayed || string(r.Value) != "taken over" {
		t.Fatalf("takeover = %+v, %v; want a fresh run after the lease lapsed", r, err)
	}
	close(release)
	err = <-done
	if !errors.Is(err, core.ErrLeaseLost) || !errors.Is(err, core.ErrInFlight) {
		t.Fatalf("stale owner's commit: %v; want ErrLeaseLost (and ErrInFlight)", err)
	}
	if a, b := <-relays, <-relays; a != b || a == "" {
		t.Fatalf("relay keys %q and %q: the takeover must send the provider the same key", a, b)
	}
	r, err = fresh.Call(ctx(t), req("kt", "1"), func(context.Context) ([]byte, error) { return nil, errors.New("ran again") })
	if err != nil || string(r.Value) != "taken over" {
		t.Fatalf("after takeover = %+v, %v; want the new owner's result", r, err)
	}
}

func steps(t *testing.T, s core.Store) {
	if _, ok := storekit.As[storekit.StepStore](s); !ok {
		t.Skip("store keeps no steps")
	}
	e := engine(t, s)
	charges, runs := 0, 0
	fn := func(ctx context.Context) ([]byte, error) {
		runs++
		id, err := core.Step(ctx, "charge", func(context.Context) ([]byte, error) {
			charges++
			return []byte("ch_" + strconv.Itoa(charges)), nil
		})
		if err != nil {
			return nil, err
		}
		if runs == 1 {
			return nil, errors.New("ledger down")
		}
		return id, nil
	}
	if _, err := e.Call(ctx(t), req("ks", "1"), fn); err == nil {
		t.Fatal("first run: want the ledger's error")
	}
	r, err := e.Call(ctx(t), req("ks", "1"), fn)
	if err != nil || string(r.Value) != "ch_1" || charges != 1 {
		t.Fatalf("retry = %+v, %v with %d charges; want the stored step, one charge", r, err, charges)
	}
}

func nested(t *testing.T, s core.Store) {
	e := engine(t, s)
	outer, err := e.Call(ctx(t), req("outer", "1"), func(ctx context.Context) ([]byte, error) {
		inner, err := e.Call(ctx, req("inner", "1"), func(ictx context.Context) ([]byte, error) {
			if k, _ := core.KeyFromContext(ictx); k != "inner" {
				t.Errorf("inner call's key = %q", k)
			}
			return []byte("in"), nil
		})
		if err != nil {
			return nil, err
		}
		if k, _ := core.KeyFromContext(ctx); k != "outer" {
			t.Errorf("outer call's key after the inner call = %q", k)
		}
		return append([]byte("out+"), inner.Value...), nil
	})
	if err != nil || string(outer.Value) != "out+in" {
		t.Fatalf("nested = %+v, %v", outer, err)
	}
	if rec, err := s.Get(ctx(t), scope, "inner"); err != nil || rec.Status != storekit.StatusCompleted {
		t.Fatalf("inner record: %+v, %v; want its own completed record", rec, err)
	}
}

func limits(t *testing.T, s core.Store) {
	e := engine(t, s, core.WithMaxRequestBytes(8), core.WithMaxResponseBytes(4))
	never := func(context.Context) ([]byte, error) {
		t.Errorf("fn ran for a refused call")
		return nil, nil
	}
	var ce *core.CallError
	if _, err := e.Call(ctx(t), req("big-in", "123456789"), never); !errors.As(err, &ce) || ce.Problem != problem.BodyTooLarge {
		t.Errorf("input over the limit: %v; want CallError %s", err, problem.BodyTooLarge)
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Call(canceled, req("gone", "1"), never); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: %v; want context.Canceled", err)
	}
	// A result too large to keep: the first caller gets it, a retry is
	// told it completed (and fn does not run again).
	r, err := e.Call(ctx(t), req("big-out", "1"), func(context.Context) ([]byte, error) { return []byte("0123456789"), nil })
	if err != nil || string(r.Value) != "0123456789" {
		t.Fatalf("large result = %+v, %v; want it returned", r, err)
	}
	if _, err := e.Call(ctx(t), req("big-out", "1"), never); !errors.Is(err, core.ErrNotRetained) {
		t.Errorf("retry of a call whose result was not kept: %v; want ErrNotRetained", err)
	}
}
