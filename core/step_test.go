package core_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
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
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

// stepCounter is a step function that counts its runs.
type stepCounter struct {
	runs   atomic.Int64
	result string
	err    error
}

func (c *stepCounter) fn(context.Context) ([]byte, error) {
	c.runs.Add(1)
	if c.err != nil {
		return nil, c.err
	}
	return []byte(c.result), nil
}

// unwrapStore is a store decorator that hides the capabilities of the store
// it wraps but exposes it through Unwrap.
type unwrapStore struct{ core.Store }

func (s unwrapStore) Unwrap() core.Store { return s.Store }

// countingSteps counts memstore's step calls.
type countingSteps struct {
	*memstore.Store
	loads, saves atomic.Int64
}

func (s *countingSteps) LoadSteps(ctx context.Context, f storekit.Fence) (map[string][]byte, error) {
	s.loads.Add(1)
	return s.Store.LoadSteps(ctx, f)
}

func (s *countingSteps) SaveStep(ctx context.Context, f storekit.Fence, name string, result []byte) error {
	s.saves.Add(1)
	return s.Store.SaveStep(ctx, f, name, result)
}

// noSteps hides memstore's StepStore methods.
type noSteps struct{ core.Store }

func TestStepWithoutLeaseJustRuns(t *testing.T) {
	c := &stepCounter{result: "r"}
	for range 2 {
		out, err := core.Step(context.Background(), "charge", c.fn)
		require.NoError(t, err)
		assert.Equal(t, "r", string(out))
	}
	assert.EqualValues(t, 2, c.runs.Load(), "outside a lease a step runs every time")

	// A bypassed request (GET) carries no lease either.
	eng := newEngine(t, memstore.New())
	d := decide(t, eng, core.Request{Method: http.MethodGet, Route: "/pay", Header: http.Header{}})
	require.Equal(t, core.Bypass, d.Outcome)
	_, err := core.Step(d.Context(context.Background()), "charge", c.fn)
	require.NoError(t, err)
	assert.EqualValues(t, 3, c.runs.Load())

	// The limits apply without a lease too.
	_, err = core.Step(context.Background(), "big", func(context.Context) ([]byte, error) {
		return make([]byte, core.MaxStepBytes+1), nil
	})
	require.ErrorIs(t, err, core.ErrStepTooLarge)
}

func TestStepResumesAfterRetryableOutcome(t *testing.T) {
	store := memstore.New()
	eng := newEngine(t, store)
	reserve, charge, notify := &stepCounter{result: "r_1"}, &stepCounter{result: "ch_1"}, &stepCounter{err: errors.New("mail down")}

	handler := func(ctx context.Context) (adapterkit.Response, error) {
		r, err := core.Step(ctx, "reserve", reserve.fn)
		if err != nil {
			return adapterkit.Response{}, err
		}
		ch, err := core.Step(ctx, "charge", charge.fn)
		if err != nil {
			return adapterkit.Response{}, err
		}
		if _, err := core.Step(ctx, "notify", notify.fn); err != nil {
			return adapterkit.Response{Status: http.StatusServiceUnavailable}, nil
		}
		return created(string(r) + "/" + string(ch)), nil
	}

	// First attempt: reserve and charge done, notify fails -> 503, retryable.
	d := proceed(t, eng, request("k1", payBody))
	resp, err := handler(d.Context(context.Background()))
	require.NoError(t, err)
	require.NoError(t, eng.Commit(context.Background(), d, resp))

	// Retry: reserve and charge are resumed, not run; notify runs again.
	notify.err = nil
	notify.result = "n_1"
	d = proceed(t, eng, request("k1", payBody))
	resp, err = handler(d.Context(context.Background()))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.Status)
	assert.Equal(t, "r_1/ch_1", string(resp.Body))
	require.NoError(t, eng.Commit(context.Background(), d, resp))
	assert.EqualValues(t, 1, reserve.runs.Load(), "reserve ran once across two attempts")
	assert.EqualValues(t, 1, charge.runs.Load(), "charge ran once across two attempts")
	assert.EqualValues(t, 2, notify.runs.Load(), "the failed step ran again")

	// A final response ends the record: a retry replays, nothing runs.
	d = decide(t, eng, request("k1", payBody))
	require.Equal(t, core.Replay, d.Outcome)
	assert.Equal(t, "r_1/ch_1", string(d.Response.Body))

	// Another payload under the key: 422, before any step.
	d = decide(t, eng, request("k1", `{"amount":50000}`))
	requireProblem(t, d, http.StatusUnprocessableEntity, problem.PayloadMismatch)
	assert.EqualValues(t, 1, reserve.runs.Load())
}

func TestStepResumesAfterPanicAndAbort(t *testing.T) {
	eng := newEngine(t, memstore.New())
	charge := &stepCounter{result: "ch_1"}
	d := proceed(t, eng, request("k1", payBody))
	_, err := core.Step(d.Context(context.Background()), "charge", charge.fn)
	require.NoError(t, err)
	require.NoError(t, eng.Abort(context.Background(), d, errors.New("panic: booking")))

	d = proceed(t, eng, request("k1", payBody))
	out, err := core.Step(d.Context(context.Background()), "charge", charge.fn)
	require.NoError(t, err)
	assert.Equal(t, "ch_1", string(out))
	assert.EqualValues(t, 1, charge.runs.Load())
}

// TestStepTakeoverAfterCrash: an owner stores a step and dies (no commit,
// no abort); after its lease lapses, a retry through another engine gets
// the stored result without running the step, and the dead owner can no
// longer store anything.
func TestStepTakeoverAfterCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &countingSteps{Store: memstore.New()}
		dying := &dyingStore{countingSteps: store}
		const lease = 100 * time.Millisecond
		engA := newEngine(t, dying, core.WithLease(lease))
		engB := newEngine(t, store, core.WithLease(time.Minute))
		charge := &stepCounter{result: "ch_1"}

		d := proceed(t, engA, request("k1", payBody))
		ctxA := d.Context(context.Background())
		_, err := core.Step(ctxA, "charge", charge.fn)
		require.NoError(t, err)
		assert.EqualValues(t, 0, store.loads.Load(), "a fresh claim reads no steps")
		crash(t, engA, dying, d)
		time.Sleep(3 * lease)

		d2 := proceed(t, engB, request("k1", payBody))
		ctxB := d2.Context(context.Background())
		out, err := core.Step(ctxB, "charge", charge.fn)
		require.NoError(t, err)
		assert.Equal(t, "ch_1", string(out), "the stored result")
		assert.EqualValues(t, 1, charge.runs.Load(), "the step did not run again after the takeover")
		notify := &stepCounter{result: "n"}
		_, err = core.Step(ctxB, "notify", notify.fn)
		require.NoError(t, err)
		assert.EqualValues(t, 1, store.loads.Load(), "a resumed execution reads its steps once")

		// The dead owner (had it survived) can neither read nor store steps
		// any more: its next step is refused before its function runs.
		lateA := storetest.ContextWithLease(context.Background(), storetest.NewLease(store, d.Fence()))
		_, err = core.Step(lateA, "refund", notify.fn)
		require.ErrorIs(t, err, core.ErrLeaseLost)
		assert.EqualValues(t, 1, notify.runs.Load())
		require.NoError(t, engB.Commit(context.Background(), d2, created(string(out))))
	})
}

// dyingStore is a store whose process can be killed: from then on its
// writes to the record do nothing (Fail, Heartbeat), as for a SIGKILLed
// instance; its steps stay reachable.
type dyingStore struct {
	*countingSteps
	dead atomic.Bool
}

var errKilled = errors.New("process killed")

func (s *dyingStore) Fail(ctx context.Context, f storekit.Fence) error {
	if s.dead.Load() {
		return errKilled
	}
	return s.countingSteps.Fail(ctx, f)
}

func (s *dyingStore) Heartbeat(ctx context.Context, f storekit.Fence, d time.Duration) error {
	if s.dead.Load() {
		return errKilled
	}
	return s.countingSteps.Heartbeat(ctx, f, d)
}

// crash stops d's owner as a kill would: no further write to the record.
func crash(t *testing.T, eng *core.Engine, store *dyingStore, d *core.Decision) {
	t.Helper()
	store.dead.Store(true)
	require.ErrorIs(t, eng.Abort(context.Background(), d, errKilled), errKilled)
	rec, err := store.Get(context.Background(), d.Scope, d.Key)
	require.NoError(t, err)
	require.Equal(t, storekit.StatusProcessing, rec.Status, "the crash must leave the record processing")
}

func TestStepOnceWithinExecution(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eng := newEngine(t, memstore.New())
		d := proceed(t, eng, request("k1", payBody))
		ctx := d.Context(context.Background())
		c := &stepCounter{result: "x"}
		slow := func(ctx context.Context) ([]byte, error) {
			time.Sleep(20 * time.Millisecond)
			return c.fn(ctx)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := core.Step(ctx, "charge", slow)
				if err != nil || string(out) != "x" {
					t.Errorf("concurrent Step: %q, %v", out, err)
				}
			}()
		}
		wg.Wait()
		out, err := core.Step(ctx, "charge", slow)
		require.NoError(t, err)
		assert.Equal(t, "x", string(out))
		assert.EqualValues(t, 1, c.runs.Load(), "one name runs once per execution, concurrent calls included")

		// The caller owns the returned slice.
		out[0] = 'Y'
		again, err := core.Step(ctx, "charge", slow)
		require.NoError(t, err)
		assert.Equal(t, "x", string(again))
	})
}

func TestStepFailureStoresNothing(t *testing.T) {
	store := memstore.New()
	eng := newEngine(t, store)
	boom := errors.New("provider: 502")
	c := &stepCounter{err: boom}
	d := proceed(t, eng, request("k1", payBody))
	ctx := d.Context(context.Background())
	_, err := core.Step(ctx, "charge", c.fn)
	require.ErrorIs(t, err, boom, "the function's error is returned as is")
	steps, err := store.LoadSteps(context.Background(), d.Fence())
	require.NoError(t, err)
	assert.Empty(t, steps)
	// Within the same execution, a failed step may be tried again.
	c.err, c.result = nil, "ch_1"
	out, err := core.Step(ctx, "charge", c.fn)
	require.NoError(t, err)
	assert.Equal(t, "ch_1", string(out))
	assert.EqualValues(t, 2, c.runs.Load())
}

func TestStepLimitsAndNames(t *testing.T) {
	eng := newEngine(t, memstore.New())
	d := proceed(t, eng, request("k1", payBody))
	ctx := d.Context(context.Background())
	c := &stepCounter{result: "x"}
	for _, name := range []string{"", strings.Repeat("a", storekit.MaxStepNameBytes+1), "bad\x00name", "new\nline", string([]byte{0xff, 'a'})} {
		_, err := core.Step(ctx, name, c.fn)
		require.ErrorIs(t, err, core.ErrStepName, "name %q", name)
	}
	assert.EqualValues(t, 0, c.runs.Load(), "an invalid name runs nothing")

	_, err := core.Step(ctx, "big", func(context.Context) ([]byte, error) { return make([]byte, core.MaxStepBytes+1), nil })
	require.ErrorIs(t, err, core.ErrStepTooLarge)
	out, err := core.Step(ctx, "max", func(context.Context) ([]byte, error) { return make([]byte, core.MaxStepBytes), nil })
	require.NoError(t, err)
	assert.Len(t, out, core.MaxStepBytes)
	out, err = core.Step(ctx, "nil", func(context.Context) ([]byte, error) { return nil, nil })
	require.NoError(t, err)
	assert.Empty(t, out)
	_, err = core.Step(ctx, "nilfn", nil)
	require.Error(t, err)
}

func TestStepsUnsupported(t *testing.T) {
	store := noSteps{memstore.New()}
	assert.False(t, core.StepsSupported(store))
	assert.True(t, core.StepsSupported(memstore.New()))
	assert.True(t, core.StepsSupported(unwrapStore{noSteps{memstore.New()}}) == false && core.StepsSupported(unwrapStore{memstore.New()}), "seen through Unwrap")

	_, err := core.New(store, core.WithStepsRequired(true))
	require.Error(t, err, "WithStepsRequired refuses a store without steps")
	assert.Contains(t, err.Error(), "WithStepsRequired")
	newEngine(t, memstore.New(), core.WithStepsRequired(true))

	eng := newEngine(t, store)
	d := proceed(t, eng, request("k1", payBody))
	c := &stepCounter{result: "x"}
	_, err = core.Step(d.Context(context.Background()), "charge", c.fn)
	require.ErrorIs(t, err, core.ErrStepsUnsupported)
	assert.EqualValues(t, 0, c.runs.Load(), "never run unprotected")
}

func TestStepDoneContext(t *testing.T) {
	eng := newEngine(t, memstore.New())
	d := proceed(t, eng, request("k1", payBody))
	ctx, cancel := context.WithCancel(d.Context(context.Background()))
	cancel()
	c := &stepCounter{result: "x"}
	_, err := core.Step(ctx, "charge", c.fn)
	require.ErrorIs(t, err, context.Canceled)
	assert.EqualValues(t, 0, c.runs.Load(), "no effect started on a finished context")
}

// TestStepSavedDespiteClientGone: the client disconnects while the step's
// function runs; the effect happened, so its result is stored anyway.
func TestStepSavedDespiteClientGone(t *testing.T) {
	store := memstore.New()
	eng := newEngine(t, store)
	d := proceed(t, eng, request("k1", payBody))
	ctx, cancel := context.WithCancel(d.Context(context.Background()))
	_, err := core.Step(ctx, "charge", func(context.Context) ([]byte, error) {
		cancel() // the client went away during the provider call
		return []byte("ch_1"), nil
	})
	require.NoError(t, err)
	steps, err := store.LoadSteps(context.Background(), d.Fence())
	require.NoError(t, err)
	assert.Equal(t, "ch_1", string(steps["charge"]))
}

func TestStepNewAgainAfterRetention(t *testing.T) {
	var now atomic.Pointer[time.Time]
	t0 := time.Now()
	now.Store(&t0)
	store := memstore.New(memstore.WithClock(func() time.Time { return *now.Load() }))
	eng := newEngine(t, store)
	c := &stepCounter{result: "ch_1"}
	d := proceed(t, eng, request("k1", payBody))
	_, err := core.Step(d.Context(context.Background()), "charge", c.fn)
	require.NoError(t, err)
	require.NoError(t, eng.Commit(context.Background(), d, adapterkit.Response{Status: http.StatusBadGateway}))

	later := t0.Add(48 * time.Hour) // past the default 24h retention
	now.Store(&later)
	d = proceed(t, eng, request("k1", payBody))
	c.result = "ch_2"
	out, err := core.Step(d.Context(context.Background()), "charge", c.fn)
	require.NoError(t, err)
	assert.Equal(t, "ch_2", string(out), "a key new again after retention sees no old step")
	assert.EqualValues(t, 2, c.runs.Load())
}

type receipt struct {
	ChargeID string   `json:"charge_id"`
	Amount   int64    `json:"amount"`
	Tags     []string `json:"tags"`
}

func TestStepJSON(t *testing.T) {
	store := memstore.New()
	eng := newEngine(t, store)
	runs := 0
	fn := func(context.Context) (receipt, error) {
		runs++
		return receipt{ChargeID: "ch_1", Amount: 1000, Tags: []string{"a"}}, nil
	}
	d := proceed(t, eng, request("k1", payBody))
	got, err := core.StepJSON(d.Context(context.Background()), "charge", fn)
	require.NoError(t, err)
	assert.Equal(t, receipt{ChargeID: "ch_1", Amount: 1000, Tags: []string{"a"}}, got)
	require.NoError(t, eng.Abort(context.Background(), d, nil))

	d = proceed(t, eng, request("k1", payBody))
	got, err = core.StepJSON(d.Context(context.Background()), "charge", fn)
	require.NoError(t, err)
	assert.Equal(t, receipt{ChargeID: "ch_1", Amount: 1000, Tags: []string{"a"}}, got, "decoded from the stored JSON")
	assert.Equal(t, 1, runs)

	// A stored value that does not decode into the type: an error, not a zero value.
	_, err = core.StepJSON(d.Context(context.Background()), "charge", func(context.Context) (int, error) { return 1, nil })
	require.Error(t, err)
	// A value that does not encode.
	_, err = core.StepJSON(d.Context(context.Background()), "chan", func(context.Context) (chan int, error) { return make(chan int), nil })
	require.Error(t, err)
}
