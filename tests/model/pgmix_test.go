package model

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore"
)

// claimMode is the path a claim of a history took.
type claimMode int32

const (
	insertMode   claimMode = 1 // the bare insert first
	functionMode claimMode = 2 // the claim function directly
)

// Burst sizes of insertFirstMix's fresh claims. The store's estimate
// is an average over about the last 32 claims with a switch at half: 48
// claims that create their key bring it below the switch from anywhere
// (1 × (31/32)^48 < 0.22), 16 from just above it.
const (
	startBurst  = 48
	switchBurst = 16
	burstsPerH  = 3
)

// insertFirstMix drives and counts the claim paths of a store
// under the model. The model's histories are retry-heavy (two keys,
// lapses, takeovers, replays): on their own they keep the store calling
// the claim function first. Another scope's traffic of new keys, as other
// users' first executions in production, brings it back to the bare
// insert: a burst before each history (so that its first claims, racing
// for its new keys, insert first), and a few more during the history
// whenever one of its claims called the function first (so that the
// store switches both ways while the history runs). Those claims are not
// part of the history; every claim of the history is checked.
//
// It is a pgx tracer on the store's pool, which tells the paths apart by
// their statements: the bare insert (ON CONFLICT DO NOTHING), and the
// claim function, which follows an insert that found the key in the same
// claim (the same context) or is called directly.
type insertFirstMix struct {
	store *pgstore.Store
	bg    atomic.Int64 // the other scope's keys
	kick  chan struct{}
	left  atomic.Int32 // bursts the current history may still start

	missed                      sync.Map // context of a claim whose insert found the key
	batchKeys                   sync.Map // scope NUL key of each history claim sent in a batched insert
	batched, batchedRows        atomic.Int64
	batchedCalls                atomic.Int64
	batchedCompletes            atomic.Int64 // pipelines carrying two or more completes
	historyCompletes            atomic.Int64 // those of them carrying a history's
	batching                    bool         // batchtest.WithLimit(1): batched statements are required
	inserted, fellBack, fnFirst atomic.Int64
	last                        atomic.Int32 // claimMode of the latest claim
	toInsert, toFunction        atomic.Int64 // switches between claims of histories
	mu                          sync.Mutex
	modes                       map[string]claimMode // per history scope: the modes its claims took
}

const mixScope = "fresh-keys" // the other traffic's scope

type insertCtxKey struct{}

func newInsertFirstMix() *insertFirstMix {
	return &insertFirstMix{kick: make(chan struct{}, 1), modes: map[string]claimMode{}}
}

// TraceQueryStart implements pgx.QueryTracer.
func (m *insertFirstMix) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	scope := ""
	for _, a := range d.Args { // the claim's first string argument
		if s, ok := a.(string); ok {
			scope = s
			break
		}
	}
	if len(d.Args) > 1 {
		if strings.Contains(d.SQL, "WITH ORDINALITY") {
			// claimbatch.go's function calls: counted, not attributed to
			// a path (fewer function-first claims and fallbacks, never more).
			m.batchedCalls.Add(1)
			return ctx
		}
		if scopes, ok := d.Args[0].([]string); ok { // claimbatch.go's inserts: arrays
			keys, _ := d.Args[1].([]string)
			for i, scope := range scopes {
				if i < len(keys) {
					m.batchedInsert(scope, keys[i])
				}
			}
			m.batched.Add(1)
			return ctx
		}
	}
	if scope == "" || scope == mixScope {
		return ctx
	}
	switch {
	case strings.Contains(d.SQL, "ON CONFLICT (scope, key) DO NOTHING"):
		m.mode(scope, insertMode)
		return context.WithValue(ctx, insertCtxKey{}, ctx)
	case strings.Contains(d.SQL, `_claim_row"(`):
		key, _ := d.Args[1].(string)
		if _, ok := m.batchKeys.LoadAndDelete(scope + "\x00" + key); ok {
			m.fellBack.Add(1) // after a batched insert that found its key
			return ctx
		}
		if _, ok := m.missed.LoadAndDelete(ctx); ok {
			m.fellBack.Add(1)
			return ctx
		}
		m.fnFirst.Add(1)
		m.mode(scope, functionMode)
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
	return ctx
}

// TraceBatchStart implements pgx.BatchTracer: counts the pipelines of
// completebatch.go (two or more fenced completes, each raising on a miss),
// those that carry a history's complete, and those that carry new keys'
// inserts (writebatch.go, plain mode), as claimbatch.go's are counted.
func (m *insertFirstMix) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	n, history, inserts := 0, false, false
	for _, q := range d.Batch.QueuedQueries {
		if strings.Contains(q.SQL, "ON CONFLICT (scope, key) DO NOTHING") && len(q.Arguments) > 1 {
			inserts = true
			scope, _ := q.Arguments[0].(string)
			key, _ := q.Arguments[1].(string)
			m.batchedInsert(scope, key)
		}
		if strings.Contains(q.SQL, "the fenced complete matched") {
			n++
			if scope, _ := q.Arguments[0].(string); scope != mixScope {
				history = true
			}
		}
	}
	if inserts {
		m.batched.Add(1)
	}
	if n >= 2 {
		m.batchedCompletes.Add(1)
		if history {
			m.historyCompletes.Add(1)
		}
	}
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (m *insertFirstMix) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (m *insertFirstMix) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TraceQueryEnd implements pgx.QueryTracer.
func (m *insertFirstMix) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	claim, ok := ctx.Value(insertCtxKey{}).(context.Context)
	if !ok || d.Err != nil {
		return
	}
	if d.CommandTag.RowsAffected() == 1 {
		m.inserted.Add(1)
	} else {
		m.missed.Store(claim, true) // its claim calls the function next
	}
}

// batchedInsert counts a history claim's insert sent with others (in
// claimbatch.go's statement or writebatch.go's pipeline). A key the batch
// finds existing calls the function next. One it inserts leaves its entry
// behind, which can only count a later function-first claim of the key as
// such a fallback: fewer function-first claims, never more.
func (m *insertFirstMix) batchedInsert(scope, key string) {
	if scope == mixScope {
		return
	}
	m.batchedRows.Add(1)
	m.mode(scope, insertMode)
	m.batchKeys.Store(scope+"\x00"+key, true)
}

func (m *insertFirstMix) mode(scope string, c claimMode) {
	if old := claimMode(m.last.Swap(int32(c))); old != 0 && old != c {
		if c == insertMode {
			m.toInsert.Add(1)
		} else {
			m.toFunction.Add(1)
		}
	}
	m.mu.Lock()
	m.modes[scope] |= c
	m.mu.Unlock()
}

// burst claims n new keys of the other scope (claims a kill ends do not
// count; at most 2n attempts).
func (m *insertFirstMix) burst(n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu      sync.Mutex
		fences  []storekit.Fence
		ok, att atomic.Int32
		claims  sync.WaitGroup
	)
	// Four at a time: the fresh claims reach the store's estimate while
	// the history still runs.
	for range 4 {
		claims.Go(func() {
			for ok.Load() < int32(n) && att.Add(1) <= int32(2*n) {
				res, err := m.store.Claim(ctx, storekit.ClaimRequest{
					Scope: mixScope, Key: "k" + strconv.FormatInt(m.bg.Add(1), 10), Method: "POST", Route: "/model",
					Fingerprint: "A", Lease: Lease, Retention: Retention,
				})
				if err == nil {
					ok.Add(1)
					if m.batching && res.Claimed {
						mu.Lock()
						fences = append(fences, storekit.Fence{Scope: mixScope, Key: res.Record.Key, Token: res.Record.Token})
						mu.Unlock()
					}
				}
			}
		})
	}
	claims.Wait()
	// With batching, completed together: their completes share
	// pipelines with each other and with the histories'.
	var wg sync.WaitGroup
	for _, f := range fences {
		wg.Go(func() { _ = m.store.Complete(ctx, f, storekit.StoredResponse{Status: 201}) })
	}
	wg.Wait()
}

// drive returns envs with the bursts: the one before each history, and a
// goroutine (ended at the test's cleanup) for those during it.
func (m *insertFirstMix) drive(t *testing.T, store *pgstore.Store, envs func(h int) *Env) func(h int) *Env {
	m.store = store
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-m.kick:
				if m.left.Add(-1) >= 0 {
					m.burst(switchBurst)
				}
			}
		}
	}()
	// Registered after the store's Close: runs before it.
	t.Cleanup(func() { close(stop); <-done })
	return func(h int) *Env {
		m.left.Store(0)
		m.burst(startBurst)
		m.last.Store(0) // switches are counted within a history
		m.left.Store(burstsPerH)
		return envs(h)
	}
}

// check logs how often each path ran and fails t unless the run took
// both, the insert's fallback and both switches, and some histories ran
// claims on both sides of a switch.
func (m *insertFirstMix) check(t *testing.T, sum Summary) {
	t.Helper()
	both := 0
	m.mu.Lock()
	for _, c := range m.modes {
		if c == insertMode|functionMode {
			both++
		}
	}
	m.mu.Unlock()
	t.Logf("claim statements of the histories: %d inserts that created the key, %d that found it (the function next), %d function first; %d batched inserts carrying %d of their claims, %d batched function calls, %d batched completes (%d with a history's); %d switches to insert first, %d to function first; %d of %d histories on both sides",
		m.inserted.Load(), m.fellBack.Load(), m.fnFirst.Load(), m.batched.Load(), m.batchedRows.Load(), m.batchedCalls.Load(), m.batchedCompletes.Load(), m.historyCompletes.Load(), m.toInsert.Load(), m.toFunction.Load(), both, sum.Histories)
	if sum.Histories < 20 {
		return
	}
	for _, c := range []struct {
		what string
		n    int64
	}{
		{"bare insert that created its key", m.inserted.Load()},
		{"bare insert that found its key (the function after it)", m.fellBack.Load()},
		{"claim that called the function first", m.fnFirst.Load()},

		{"switch to insert first", m.toInsert.Load()},
		{"switch to function first", m.toFunction.Load()},
		{"history on both sides of a switch", int64(both)},
	} {
		if c.n == 0 {
			t.Errorf("the run had no %s: it proves nothing about it", c.what)
		}
	}
	// A history's complete joins a batch a few times per 20 histories:
	// required of longer runs (make model).
	if m.batching && sum.Histories >= 100 && m.historyCompletes.Load() == 0 {
		t.Errorf("batching: no history's complete was batched in %d histories", sum.Histories)
	}
	if m.batching && (m.batched.Load() == 0 || m.batchedCalls.Load() == 0 || m.batchedCompletes.Load() == 0) {
		t.Errorf("batching: %d batched inserts, %d batched function calls, %d batched completes; the run proves nothing about a kind it did not send", m.batched.Load(), m.batchedCalls.Load(), m.batchedCompletes.Load())
	}
}
