package completer_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/completer"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/nethttpidem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const lease = 100 * time.Millisecond

var userHeader = []string{"X-User-ID"}

// payments is the application: a provider charge as a step, then a
// booking. Its counters are shared by every instance, as a provider and a
// ledger are.
type payments struct {
	charges sync.Map // key -> *atomic.Int32: provider calls
	booked  sync.Map // key -> *atomic.Int32: ledger rows
}

func count(m *sync.Map, key string) *atomic.Int32 {
	v, _ := m.LoadOrStore(key, new(atomic.Int32))
	return v.(*atomic.Int32)
}

func (p *payments) total(m *sync.Map) (n int32) {
	m.Range(func(_, v any) bool { n += v.(*atomic.Int32).Load(); return true })
	return n
}

// charge is the provider call, run as a step.
func (p *payments) charge(ctx context.Context, key string) ([]byte, error) {
	return core.Step(ctx, "charge", func(context.Context) ([]byte, error) {
		count(&p.charges, key).Add(1)
		return []byte("ch_" + key), nil
	})
}

// instance is one process of the application on its engine. die, when set,
// is called after the charge: the owner dies there (it returns when the
// process is dead).
func (p *payments) instance(t *testing.T, eng *core.Engine, die func()) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments", func(w http.ResponseWriter, r *http.Request) {
		key, _ := core.KeyFromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		ch, err := p.charge(r.Context(), key)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if die != nil {
			die()
			http.Error(w, "dead", http.StatusInternalServerError)
			return
		}
		count(&p.booked, key).Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"user":%q,"charge":%q,"body":%s}`, r.Header.Get("X-User-ID"), ch, body)
	})
	mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		return r.Header.Get("X-User-ID"), nil
	}))
	require.NoError(t, err)
	return mw(mux)
}

func post(h http.Handler, user, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
	r.Header.Set("X-User-ID", user)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func newEngine(t *testing.T, s core.Store, opts ...core.Option) *core.Engine {
	t.Helper()
	eng, err := core.New(s, append([]core.Option{core.WithLease(lease)}, opts...)...)
	require.NoError(t, err)
	return eng
}

func newCompleter(t *testing.T, eng *core.Engine, opts ...completer.Option) *completer.Completer {
	t.Helper()
	c, err := completer.New(eng, append([]completer.Option{completer.WithAfter(0)}, opts...)...)
	require.NoError(t, err)
	return c
}

// orphan runs one payment through a dying instance on store: the owner is
// killed after the charge step; no retry follows.
// keep lists the headers its route keeps; nil: the route is not registered.
func orphan(t *testing.T, store *memstore.Store, p *payments, user, key string, keep []string, opts ...core.Option) {
	t.Helper()
	d := storetest.NewDying(store)
	eng := newEngine(t, d, opts...)
	app := p.instance(t, eng, d.Kill)
	if keep != nil {
		// Every instance registers the same routes (the dying one keeps
		// the request with its step).
		newCompleter(t, eng, completer.HTTP(http.MethodPost, "/v1/payments", app, keep...))
	}
	w := post(app, user, key, `{"amount":42}`)
	require.GreaterOrEqual(t, w.Code, http.StatusInternalServerError)
	rec, err := store.Get(context.Background(), user, key)
	require.NoError(t, err)
	require.Equal(t, storekit.StatusProcessing, rec.Status, "the kill leaves the record processing")
}

// TestCompleterFinishesOrphanedCharge: the owner died after the charge and
// the client never retried. A completer on another instance books the
// payment once, without charging again, and the client's late retry gets
// the 201 replayed.
func TestCompleterFinishesOrphanedCharge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		p := &payments{}
		orphan(t, store, p, "u1", "k1", userHeader)
		var mu sync.Mutex
		var kinds []string
		eng := newEngine(t, store, core.WithObserver(func(ev core.Event) {
			mu.Lock()
			kinds = append(kinds, ev.Kind)
			mu.Unlock()
		}))
		app := p.instance(t, eng, nil)
		c := newCompleter(t, eng, completer.HTTP(http.MethodPost, "/v1/payments", app, "X-User-ID"))

		rep, err := c.Once(t.Context())
		require.NoError(t, err)
		assert.Equal(t, completer.Report{}, rep, "a live lease is not taken")

		time.Sleep(2 * lease) // the dead owner's lease lapses (synctest's clock)
		rep, err = c.Once(t.Context())
		require.NoError(t, err)
		assert.Equal(t, completer.Report{Finished: 1}, rep)
		assert.EqualValues(t, 1, p.total(&p.charges), "the provider was charged once")
		assert.EqualValues(t, 1, p.total(&p.booked), "the ledger has one row")
		mu.Lock()
		assert.Equal(t, []string{core.EventStalled, core.EventCommit}, kinds, "the takeover is told from a client's")
		mu.Unlock()

		w := post(app, "u1", "k1", `{"amount":42}`)
		assert.Equal(t, http.StatusCreated, w.Code)
		assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
		assert.JSONEq(t, `{"user":"u1","charge":"ch_k1","body":{"amount":42}}`, w.Body.String(),
			"the re-run saw the kept body and header")
		assert.EqualValues(t, 1, p.total(&p.booked))
	})
}

// TestRunFinishesWithinTheInterval: Run looks every WithInterval; the
// orphan is booked within one interval of its lease lapsing, and Run
// returns when its context ends.
func TestRunFinishesWithinTheInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		p := &payments{}
		orphan(t, store, p, "u1", "k1", userHeader)
		eng := newEngine(t, store)
		const every = 500 * time.Millisecond
		c := newCompleter(t, eng, completer.HTTP(http.MethodPost, "/v1/payments", p.instance(t, eng, nil), "X-User-ID"),
			completer.WithInterval(every))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()

		time.Sleep(lease) // synctest's clock: the lease has lapsed by now
		synctest.Wait()
		time.Sleep(every)
		synctest.Wait()
		assert.EqualValues(t, 1, p.total(&p.booked), "booked within one interval")
		cancel()
		assert.NoError(t, <-done)
	})
}

// TestCompleterFinishesOrphanedCall is the same for Engine.Call.
func TestCompleterFinishesOrphanedCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		p := &payments{}
		req := core.CallRequest{Scope: "shop", Key: "job-1", Name: "charge", Input: []byte(`{"amount":7}`)}
		book := func(ctx context.Context, input []byte) ([]byte, error) {
			ch, err := p.charge(ctx, req.Key)
			if err != nil {
				return nil, err
			}
			count(&p.booked, req.Key).Add(1)
			return append(ch, input...), nil
		}

		d := storetest.NewDying(store)
		dead := newEngine(t, d)
		newCompleter(t, dead, completer.Call("charge", book))
		_, err := dead.Call(t.Context(), req, func(ctx context.Context) ([]byte, error) {
			if _, err := p.charge(ctx, req.Key); err != nil {
				return nil, err
			}
			d.Kill()
			return nil, storetest.ErrKilled
		})
		require.Error(t, err)

		eng := newEngine(t, store)
		c := newCompleter(t, eng, completer.Call("charge", book))
		time.Sleep(2 * lease)
		rep, err := c.Once(t.Context())
		require.NoError(t, err)
		assert.Equal(t, completer.Report{Finished: 1}, rep)
		assert.EqualValues(t, 1, p.total(&p.charges))
		assert.EqualValues(t, 1, p.total(&p.booked))

		res, err := eng.Call(t.Context(), req, func(context.Context) ([]byte, error) {
			t.Error("the retry ran the call again")
			return nil, nil
		})
		require.NoError(t, err)
		assert.True(t, res.Replayed)
		assert.Equal(t, `ch_job-1{"amount":7}`, string(res.Value))
	})
}

// TestCompleterCompensates: an application that prefers to refund an
// orphaned charge gives the route a refunding handler behind the same
// middleware. It runs under the taken-over lease, gets the stored charge
// from its step without charging again, refunds, and its answer is what
// the client's late retry gets.
func TestCompleterCompensates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		p := &payments{}
		orphan(t, store, p, "u1", "k1", userHeader)
		eng := newEngine(t, store)
		var refunds sync.Map
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/payments", func(w http.ResponseWriter, r *http.Request) {
			key, _ := core.KeyFromContext(r.Context())
			ch, err := p.charge(r.Context(), key) // the stored charge: no provider call
			if err == nil {
				_, err = core.Step(r.Context(), "refund", func(context.Context) ([]byte, error) {
					count(&refunds, string(ch)).Add(1)
					return []byte("re_1"), nil
				})
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusUnprocessableEntity) // final: the payment was refunded
			_, _ = w.Write([]byte(`{"refunded":"` + string(ch) + `"}`))
		})
		mw, err := nethttpidem.New(eng, nethttpidem.WithScope(func(r *http.Request) (string, error) { return r.Header.Get("X-User-ID"), nil }))
		require.NoError(t, err)
		c := newCompleter(t, eng, completer.HTTP(http.MethodPost, "/v1/payments", mw(mux), "X-User-ID"))

		time.Sleep(2 * lease)
		rep, err := c.Once(t.Context())
		require.NoError(t, err)
		assert.Equal(t, completer.Report{Finished: 1}, rep)
		assert.EqualValues(t, 1, p.total(&p.charges), "charged once, before the crash")
		assert.EqualValues(t, 1, p.total(&refunds), "refunded once")
		assert.EqualValues(t, 0, p.total(&p.booked))

		w := post(p.instance(t, eng, nil), "u1", "k1", `{"amount":42}`)
		assert.Equal(t, http.StatusUnprocessableEntity, w.Code)
		assert.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
		assert.JSONEq(t, `{"refunded":"ch_k1"}`, w.Body.String())
	})
}

// TestTwoCompletersFinishEachRecordOnce: two instances run their completers
// at once over the same stalled records; each record is booked once.
func TestTwoCompletersFinishEachRecordOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		p := &payments{}
		const n = 6
		for i := range n {
			orphan(t, store, p, "u1", fmt.Sprint("k", i), []string{})
		}
		var cs []*completer.Completer
		for range 2 {
			eng := newEngine(t, store)
			// No header kept: the re-run's scope is the record's.
			cs = append(cs, newCompleter(t, eng, completer.HTTP(http.MethodPost, "/v1/payments", p.instance(t, eng, nil))))
		}
		time.Sleep(2 * lease)
		reps := make([]completer.Report, len(cs))
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Go(func() {
				var err error
				if reps[i], err = c.Once(t.Context()); err != nil {
					t.Errorf("completer %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, n, reps[0].Finished+reps[1].Finished, "every record finished: %+v", reps)
		for i := range n {
			key := fmt.Sprint("k", i)
			assert.EqualValues(t, 1, count(&p.booked, key).Load(), "%s booked once", key)
			assert.EqualValues(t, 1, count(&p.charges, key).Load(), "%s charged once", key)
			rec, err := store.Get(t.Context(), "u1", key)
			require.NoError(t, err)
			assert.Equal(t, storekit.StatusCompleted, rec.Status)
		}
	})
}

// TestCompleterLeavesUnregisteredAlone: a stalled record whose route no
// completer registered (its request was never kept) is left to the client
// and to operators; so is one with no stored step.
func TestCompleterLeavesUnregisteredAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		p := &payments{}
		orphan(t, store, p, "u1", "unregistered", nil)

		// An owner dead before its first step: nothing happened.
		d := storetest.NewDying(store)
		dead := newEngine(t, d)
		newCompleter(t, dead, completer.HTTP(http.MethodPost, "/v1/payments", p.instance(t, dead, nil)))
		dec, err := dead.Decide(t.Context(), core.Request{Method: http.MethodPost, Route: "/v1/payments", Target: "/v1/payments",
			Header: http.Header{"Idempotency-Key": {"no-step"}}, Scope: "u1"})
		require.NoError(t, err)
		require.Equal(t, core.Proceed, dec.Outcome)
		d.Kill()
		require.ErrorIs(t, dead.Abort(t.Context(), dec, storetest.ErrKilled), storetest.ErrKilled)

		eng := newEngine(t, store)
		c := newCompleter(t, eng, completer.HTTP(http.MethodPost, "/v1/payments", p.instance(t, eng, nil), "X-User-ID"))
		time.Sleep(2 * lease)
		rep, err := c.Once(t.Context())
		require.NoError(t, err)
		assert.Equal(t, completer.Report{}, rep)
		assert.EqualValues(t, 0, p.total(&p.booked))
		for _, key := range []string{"unregistered", "no-step"} {
			rec, err := store.Get(t.Context(), "u1", key)
			require.NoError(t, err)
			assert.Equal(t, storekit.StatusProcessing, rec.Status, key)
		}
	})
}

// TestCompleterAbandonsOldRecords: past WithMaxAge a stalled record is left
// to operators, with an event.
func TestCompleterAbandonsOldRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		p := &payments{}
		orphan(t, store, p, "u1", "k1", userHeader)
		var kinds []string
		var mu sync.Mutex
		eng, err := core.New(store, core.WithLease(lease), core.WithObserver(func(ev core.Event) {
			mu.Lock()
			kinds = append(kinds, ev.Kind)
			mu.Unlock()
		}))
		require.NoError(t, err)
		c := newCompleter(t, eng, completer.HTTP(http.MethodPost, "/v1/payments", p.instance(t, eng, nil)),
			completer.WithMaxAge(time.Second))
		time.Sleep(2 * time.Second)
		rep, err := c.Once(t.Context())
		require.NoError(t, err)
		assert.Equal(t, completer.Report{Abandoned: 1}, rep)
		assert.EqualValues(t, 0, p.total(&p.booked))
		mu.Lock()
		assert.Equal(t, []string{core.EventAbandoned}, kinds)
		mu.Unlock()
	})
}

// TestReRunOfExpiredRecordRunsNothing: when the stalled record expired
// before the completer's re-run reached it, the re-run's claim makes a new
// record; the engine releases it and runs nothing (its steps are gone: the
// handler would charge again).
func TestReRunOfExpiredRecordRunsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		p := &payments{}
		orphan(t, store, p, "u1", "k1", userHeader, core.WithRetention(time.Second))
		rec, err := store.Get(t.Context(), "u1", "k1")
		require.NoError(t, err)
		eng := newEngine(t, store)
		app := p.instance(t, eng, nil)
		time.Sleep(2 * time.Second) // past retention: the key is new again

		r := httptest.NewRequestWithContext(completer.WithMark(t.Context(), "u1", rec.CreatedAt), http.MethodPost,
			"/v1/payments", strings.NewReader(`{"amount":42}`))
		r.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		app.ServeHTTP(w, r)
		assert.Equal(t, http.StatusConflict, w.Code)
		assert.EqualValues(t, 1, p.total(&p.charges), "not charged again")
		assert.EqualValues(t, 0, p.total(&p.booked))
		got, err := store.Get(t.Context(), "u1", "k1")
		require.NoError(t, err)
		assert.Equal(t, storekit.StatusFailed, got.Status, "the new record is released for the client's own retry")
	})
}

func TestNewRefusesBadConfig(t *testing.T) {
	eng := newEngine(t, memstore.New())
	h := http.NotFoundHandler()
	for name, opts := range map[string][]completer.Option{
		"no route":    nil,
		"nil handler": {completer.HTTP("POST", "/x", nil)},
		"nil call":    {completer.Call("x", nil)},
		"interval":    {completer.HTTP("POST", "/x", h), completer.WithInterval(0)},
		"max age":     {completer.HTTP("POST", "/x", h), completer.WithAfter(time.Hour), completer.WithMaxAge(time.Minute)},
		"limit":       {completer.HTTP("POST", "/x", h), completer.WithLimit(0)},
	} {
		_, err := completer.New(eng, opts...)
		assert.Error(t, err, name)
	}
	_, err := completer.New(eng, completer.HTTP("POST", "/x", h), nil)
	assert.NoError(t, err, "a nil option is ignored")
}

// TestReplayKeepsNoRequest: a route kept for a completer costs a replay
// nothing more: the request is encoded only once the key is claimed.
func TestReplayKeepsNoRequest(t *testing.T) {
	allocs := func(kept bool) float64 {
		eng := newEngine(t, memstore.New())
		p := &payments{}
		app := p.instance(t, eng, nil)
		if kept {
			newCompleter(t, eng, completer.HTTP(http.MethodPost, "/v1/payments", app, userHeader...))
		}
		require.Equal(t, http.StatusCreated, post(app, "u", "k", `{"amount":42}`).Code)
		return testing.AllocsPerRun(50, func() { post(app, "u", "k", `{"amount":42}`) })
	}
	// Encoding the request costs a dozen allocations; other tests'
	// goroutines may add one or two to either count.
	plain, kept := allocs(false), allocs(true)
	assert.Less(t, kept-plain, 4.0, "allocations of a replay: %v on a kept route, %v on another", kept, plain)
}
