package txtest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

type testCase struct {
	name string
	fn   func(r *run)
}

// Run runs every case of the transactional contract against the store h
// describes, each on a fresh Env; with h.Counted, the statement counts per
// phase too (group "QueryCounts").
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Tx == nil || h.Defer == nil || h.ErrNoLease == nil || h.ErrLeaseFinished == nil {
		t.Fatal("txtest: Harness needs New, Tx, Defer, ErrNoLease and ErrLeaseFinished")
	}
	if len(h.SQLCommits) == 0 {
		h.SQLCommits = []string{"COMMIT"}
	}
	if len(h.SQLRollbacks) == 0 {
		h.SQLRollbacks = []string{"ROLLBACK"}
	}
	if h.SQLRollbackErr == nil {
		h.SQLRollbackErr = storekit.ErrNotCommitted
	}
	var cases []testCase
	cases = append(cases, txCases...)
	cases = append(cases, endCases(&h)...)
	cases = append(cases, deferCases...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if h.Parallel {
				t.Parallel()
			}
			e := h.New(t)
			if h.CommitMarks != (e.Marks != nil) {
				t.Fatal("txtest: Env.Marks is set exactly when Harness.CommitMarks is")
			}
			c.fn(&run{T: t, h: &h, e: e})
		})
	}
	if h.Counted != nil {
		t.Run("QueryCounts", func(t *testing.T) {
			if h.Parallel {
				t.Parallel()
			}
			queryCounts(t, &h)
		})
	}
}

// run is one case: its test, the harness and the case's Env.
type run struct {
	*testing.T
	h *Harness
	e *Env
}

const scope = "tenant"

// q rewrites ? placeholders for the database.
func (r *run) q(query string) string {
	if !r.h.Dollar {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func claimReq(key string, lease time.Duration) storekit.ClaimRequest {
	return storekit.ClaimRequest{Scope: scope, Key: key, Method: "POST", Route: "/v1/payments",
		Fingerprint: "f00d", Lease: lease, Retention: time.Hour}
}

// claim claims key (it must be claimed) and returns the handler's context
// and fence.
func (r *run) claim(key string, lease time.Duration) (context.Context, storekit.Fence) {
	r.Helper()
	return r.claimReq(claimReq(key, lease))
}

func (r *run) claimReq(req storekit.ClaimRequest) (context.Context, storekit.Fence) {
	r.Helper()
	res, err := r.e.Store.Claim(r.Context(), req)
	if err != nil || !res.Claimed {
		r.Fatalf("claim %q: claimed %v, %v; want claimed", req.Key, res.Claimed, err)
	}
	f := storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
	return r.lease(r.e.Store, f), f
}

// lease returns a handler's context holding a lease of f granted by s. If
// the case ends early, the lease is failed at cleanup, so that no
// transaction stays open (a pool could not close).
func (r *run) lease(s storekit.Store, f storekit.Fence) context.Context {
	ctx := storetest.ContextWithLease(r.Context(), storetest.NewLease(s, f))
	r.Cleanup(func() { _ = r.e.Store.Fail(context.WithoutCancel(ctx), f) })
	return ctx
}

func (r *run) tx(ctx context.Context) Tx {
	r.Helper()
	tx, err := r.h.Tx(ctx)
	if err != nil {
		r.Fatalf("Tx: %v", err)
	}
	return tx
}

// book is a handler's write: a ledger row (key, owner) in the lease's
// transaction.
func (r *run) book(ctx context.Context, key string, owner int64) error {
	tx, err := r.h.Tx(ctx)
	if err != nil {
		return err
	}
	return tx.Exec(ctx, r.q("INSERT INTO "+r.e.Ledger+" (k, owner) VALUES (?, ?)"), key, owner)
}

func (r *run) mustBook(ctx context.Context, f storekit.Fence) {
	r.Helper()
	if err := r.book(ctx, f.Key, f.Token); err != nil {
		r.Fatalf("handler's write: %v", err)
	}
}

// deferRow queues the ledger row (key, the lease's token) with Defer.
func (r *run) deferRow(ctx context.Context, key string) error {
	l, _ := storekit.LeaseFromContext(ctx)
	return r.h.Defer(ctx, r.q("INSERT INTO "+r.e.Ledger+" (k, owner) VALUES (?, ?)"), key, l.Fence().Token)
}

func (r *run) mustDefer(ctx context.Context, query string, args ...any) {
	r.Helper()
	if err := r.h.Defer(ctx, r.q(query), args...); err != nil {
		r.Fatalf("Defer: %v", err)
	}
}

// refused is a statement every database refuses: owner is NOT NULL.
func (r *run) refused() string {
	return "INSERT INTO " + r.e.Ledger + " (k, owner) VALUES ('refused', NULL)"
}

// owners returns the owner column of key's ledger rows, sorted.
func (r *run) owners(key string) []int64 {
	r.Helper()
	got, err := r.e.Ints(r.Context(), r.q("SELECT owner FROM "+r.e.Ledger+" WHERE k = ?"), key)
	if err != nil {
		r.Fatalf("read the ledger: %v", err)
	}
	slices.Sort(got)
	return got
}

func (r *run) wantOwners(key string, want ...int64) {
	r.Helper()
	slices.Sort(want)
	if got := r.owners(key); !slices.Equal(got, want) {
		r.Fatalf("ledger rows of %q: owners %v, want %v", key, got, want)
	}
}

func (r *run) record(key string) storekit.Record {
	r.Helper()
	rec, err := r.e.Store.Get(context.WithoutCancel(r.Context()), scope, key)
	if err != nil {
		r.Fatalf("get %q: %v", key, err)
	}
	return rec
}

// body is the response every Complete of the kit stores.
func body(what string) storekit.StoredResponse {
	return storekit.StoredResponse{Status: 201, Body: []byte(what)}
}

// wantCompleted: the record holds the response with body.
func (r *run) wantCompleted(key, body string) {
	r.Helper()
	rec := r.record(key)
	if rec.Status != storekit.StatusCompleted || rec.Response == nil || rec.Response.NotRetained || string(rec.Response.Body) != body {
		r.Fatalf("record %q: %s, response %+v; want completed with body %q", key, rec.Status, rec.Response, body)
	}
}

// wantNotRetained: the record is completed as not retained, and a retry
// gets it instead of running the handler again.
func (r *run) wantNotRetained(key string) {
	r.Helper()
	rec := r.record(key)
	if rec.Status != storekit.StatusCompleted || rec.Response == nil || !rec.Response.NotRetained {
		r.Fatalf("record %q: %s, response %+v; want completed as not retained", key, rec.Status, rec.Response)
	}
	r.wantRetry(key, false)
}

// wantReleased: the record is failed, and a retry claims it at once.
func (r *run) wantReleased(key string) {
	r.Helper()
	if rec := r.record(key); rec.Status != storekit.StatusFailed {
		r.Fatalf("record %q: %s, want failed (released)", key, rec.Status)
	}
	r.wantRetry(key, true)
}

// wantRetry checks whether a retry of key (same request, an hour's lease)
// claims it, and leaves it to be failed at cleanup.
func (r *run) wantRetry(key string, claimed bool) {
	r.Helper()
	res, err := r.e.Store.Claim(r.Context(), claimReq(key, time.Hour))
	if err != nil || res.Claimed != claimed {
		r.Fatalf("retry of %q: claimed %v (%s), %v; want claimed %v", key, res.Claimed, res.Record.Status, err, claimed)
	}
	if claimed {
		r.lease(r.e.Store, storekit.Fence{Scope: scope, Key: key, Token: res.Record.Token})
	}
}

// wantIdle: no connection is held, and no commit mark is left.
func (r *run) wantIdle() {
	r.Helper()
	if n := r.e.InUse(); n != 0 {
		r.Errorf("%d connections still held", n)
	}
	r.wantMarks(0)
}

func (r *run) wantMarks(want int) {
	r.Helper()
	if r.e.Marks == nil {
		return
	}
	if n := r.e.Marks(r.T); n != want {
		r.Errorf("%d commit marks, want %d", n, want)
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s = %v, want %v", what, err, want)
	}
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// foreignStore is a store that is no store's under test, and unwraps to none.
type foreignStore struct{ storekit.Store }

// decorator is a store decorator (metrics, tracing) exposing its store.
type decorator struct{ storekit.Store }

func (d decorator) Unwrap() storekit.Store { return d.Store }
