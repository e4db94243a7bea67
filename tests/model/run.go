package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

// Lease and Retention of every claim: long enough that no lease lapses and
// no record expires on its own during a history. Lapse and Expire end them
// on purpose, as steps of the history.
const (
	Lease     = time.Hour
	Retention = 1000 * Lease // more than the Lapse steps of any history (memstore's clock)
)

// Env is one history's view of the store under test.
type Env struct {
	Store core.Store
	Scope string // the history's scope; its keys are k0, k1, ...
	// Lapse and Expire end the lease (and, for Expire, the retention) of
	// one record: an operator's UPDATE of locked_until / expires_at into
	// the past. A store whose clock the test drives sets LapseAll and
	// ExpireAll instead, which move the clock for every record.
	Lapse, Expire       func(ctx context.Context, scope, key string) error
	LapseAll, ExpireAll func()
	// BusinessWrite, when set, writes the ledger row for f in the lease's
	// business transaction (ctx carries the lease; pgstore.Tx): Complete
	// and Fail then run on that context, and Audit reads the ledger.
	BusinessWrite func(ctx context.Context, f storekit.Fence) error
	Audit         func(ctx context.Context, scope, key string) ([]int64, error)
	// HandlerEndsTx, when set, tells whether the handler holding f ends
	// its business transaction itself (rolls it back) after its write,
	// before Complete or Fail (Input.Ended).
	HandlerEndsTx func(f storekit.Fence) bool
	// CommitSelf, when set, writes the ledger row for f in the lease's
	// business transaction and commits it itself (ctx carries the lease):
	// the CommitCrash step, after which the client forgets the lease
	// (unless CommitThenFinish).
	CommitSelf func(ctx context.Context, f storekit.Fence) error
	// CommitThenFinish: after CommitSelf, the handler sometimes goes on
	// (the process does not crash), and idem completes or fails its lease
	// later, with no ledger write of its own (the handler's is committed):
	// a Complete must record the response, a Fail complete the record as
	// not retained (mysqlstore.Tx, sqlitestore.Tx).
	CommitThenFinish bool
	// CommitWithoutMark: the store keeps no commit mark (pgstore), so a
	// handler's own COMMIT is covered only while the handler goes on: after
	// CommitSelf it always does, whether or not its COMMIT answered, and
	// its Complete or Fail must find out from the database whether the
	// COMMIT landed (Input.NoMark).
	CommitWithoutMark bool
	// Kill, when set, ends one of the store's own database connections at
	// a random point of the history (pg_terminate_backend, KILL
	// CONNECTION), so that calls in flight fail with an unknown outcome.
	Kill func(ctx context.Context) error
}

// Config sizes a run.
type Config struct {
	Histories    int
	Clients      int
	OpsPerClient int
	Keys         int
	// KillEvery: a client starts a connection kill before about one call
	// in KillEvery (0: never), at most MaxKills per history.
	KillEvery, MaxKills int
	Seed                uint64
	// StopAtFirst ends the run at the first history the model rejects.
	StopAtFirst bool
	// CheckTimeout bounds the linearizability check of one history; a
	// history not decided in time counts as Undecided.
	CheckTimeout time.Duration
}

// Iterations returns the number of histories to run: IDEM_MODEL_ITER when
// set (make model sets it), otherwise def.
func Iterations(tb testing.TB, def int) int {
	v := os.Getenv("IDEM_MODEL_ITER")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("IDEM_MODEL_ITER=%q: want a positive integer", v)
	}
	return n
}

// Seed returns IDEM_MODEL_SEED when set, otherwise a random seed; the run
// logs it.
func Seed(tb testing.TB) uint64 {
	if v := os.Getenv("IDEM_MODEL_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			tb.Fatalf("IDEM_MODEL_SEED=%q: %v", v, err)
		}
		return n
	}
	return rand.Uint64()
}

// Op is one call of a history, as recorded (and saved as a regression).
type Op struct {
	Client int
	In     Input
	Out    Output
	Call   int64
	Return int64
	Err    string `json:",omitempty"` // the store's error, for the reader
	// ReadBack: a Claim of a store whose answer is read after its write
	// committed, in a separate statement, so that it may show a later
	// write (an operator's Release, a lapse and another claim) and a claim
	// that took the key may answer that it did not: checked as the write
	// (claimed as answered, or, when the answer is "not claimed", perhaps
	// claimed under a token nobody saw) and a later read. No store answers
	// so any more (mysqlstore before migration 0006); kept to explain the
	// histories of TestMysqlstoreClaimReadBack.
	ReadBack bool `json:",omitempty"`
}

// Failure is a history the model rejected.
type Failure struct {
	History int
	Ops     []Op
	Info    porcupine.LinearizationInfo
}

// Summary counts what a run exercised, so that a test can show it tested
// something: claims, takeovers, replays, stale writes refused, unknown
// outcomes.
type Summary struct {
	Histories, Linearizable, Undecided int
	Calls                              map[Kind]map[Result]int
	Claims, Takeovers, Replays, Fresh  int
	Kills                              int
	DuplicateTokens                    int
	// StepsResumed counts LoadSteps answers holding a step (what a
	// takeover resumes from).
	StepsResumed int
	// Sealed counts claims answered with a record completed as not
	// retained (a lapsed lease whose handler's writes committed).
	Sealed int
}

func (s *Summary) String() string {
	return fmt.Sprintf("%d histories (%d linearizable, %d undecided), %d claims (%d fresh, %d not reported fresh: takeovers, and keys pgstore re-created), %d replays (%d not retained after a crash), %d kills, calls %v",
		s.Histories, s.Linearizable, s.Undecided, s.Claims, s.Fresh, s.Takeovers, s.Replays, s.Sealed, s.Kills, s.Calls)
}

// Count returns how many calls of kind k answered r.
func (s *Summary) Count(k Kind, r Result) int { return s.Calls[k][r] }

// Run runs cfg.Histories randomized concurrent histories, each on the Env
// newEnv returns, and checks each against the model.
func Run(ctx context.Context, cfg Config, newEnv func(h int) *Env) (Summary, []Failure) {
	sum := Summary{Calls: map[Kind]map[Result]int{}}
	var fails []Failure
	tokens := map[core.Store]map[int64]bool{} // per store: shared by histories on one database
	for h := range cfg.Histories {
		env := newEnv(h)
		if tokens[env.Store] == nil {
			tokens[env.Store] = map[int64]bool{}
		}
		seen := tokens[env.Store]
		ops, kills := runHistory(ctx, cfg, h, env)
		sum.Histories++
		sum.Kills += kills
		for _, op := range ops {
			m := sum.Calls[op.In.Kind]
			if m == nil {
				m = map[Result]int{}
				sum.Calls[op.In.Kind] = m
			}
			m[op.Out.Res]++
			if op.In.Kind == LoadSteps && op.Out.Res == OK && op.Out.Steps != (Steps{}) {
				sum.StepsResumed++
			}
			if op.In.Kind != Claim || op.Out.Res != OK {
				continue
			}
			switch {
			case op.Out.Claimed:
				sum.Claims++
				if op.Out.Fresh {
					sum.Fresh++
				} else {
					sum.Takeovers++
				}
				// A token is never handed out twice, whatever the key.
				if seen[op.Out.Rec.Tok] {
					sum.DuplicateTokens++
				}
				seen[op.Out.Rec.Tok] = true
			case op.Out.Rec.Status == storekit.StatusCompleted:
				sum.Replays++
				if op.Out.Rec.Resp == NotRetainedResp {
					sum.Sealed++
				}
			}
		}
		res, info := porcupine.CheckOperationsVerbose(Model(), toPorcupine(ops), cfg.CheckTimeout)
		switch res {
		case porcupine.Ok:
			sum.Linearizable++
		case porcupine.Illegal:
			fails = append(fails, Failure{History: h, Ops: ops, Info: info})
			if cfg.StopAtFirst {
				return sum, fails
			}
		default:
			sum.Undecided++
		}
	}
	return sum, fails
}

// Check checks a recorded history against the model.
func Check(ops []Op, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	return porcupine.CheckOperationsVerbose(Model(), toPorcupine(ops), timeout)
}

func toPorcupine(ops []Op) []porcupine.Operation {
	out := make([]porcupine.Operation, 0, len(ops))
	add := func(op Op, in Input, o Output) {
		out = append(out, porcupine.Operation{ClientId: op.Client, Input: in, Output: o, Call: op.Call, Return: op.Return, Metadata: op.Err})
	}
	for _, op := range ops {
		if !op.ReadBack || op.Out.Res != OK {
			add(op, op.In, op.Out)
			continue
		}
		// The write: perhaps claims nobody saw (the store may run its
		// procedure again after a read-back that found the record
		// claimable), and the claim answered, if any; then the read.
		add(op, op.In, Output{Res: Unknown})
		add(op, op.In, Output{Res: Unknown})
		if op.Out.Claimed {
			add(op, op.In, Output{Res: OK, Claimed: true, Fresh: op.Out.Fresh,
				Rec: View{Status: storekit.StatusProcessing, Tok: op.Out.Rec.Tok, FP: op.In.FP}})
		}
		add(op, Input{Kind: Get, Key: op.In.Key}, Output{Res: OK, Rec: op.Out.Rec})
	}
	return out
}

// Report fails tb for each failure, writing its visualization and its
// history (JSON, for a regression test under testdata/) to a new directory
// under the system's temporary directory, and printing both paths. Not
// tb.TempDir(): that is removed when the test ends, and these files are
// for reading afterwards.
func Report(tb testing.TB, name string, fails []Failure) {
	tb.Helper()
	if len(fails) == 0 {
		return
	}
	dir, err := os.MkdirTemp("", "idem-model-")
	if err != nil {
		tb.Fatalf("report: %v", err)
	}
	for _, f := range fails {
		base := filepath.Join(dir, fmt.Sprintf("%s-history%d", name, f.History))
		if err := porcupine.VisualizePath(Model(), f.Info, base+".html"); err != nil {
			tb.Errorf("write visualization: %v", err)
		}
		b, err := json.MarshalIndent(f.Ops, "", " ")
		if err == nil {
			err = os.WriteFile(base+".json", b, 0o644)
		}
		if err != nil {
			tb.Errorf("write history: %v", err)
		}
		tb.Errorf("%s: history %d (%d calls) is not linearizable against the model: visualization %s.html, history %s.json",
			name, f.History, len(f.Ops), base, base)
		explain(tb, f.Ops)
	}
}

// explain logs, for each key whose calls are not linearizable, the longest
// order of its calls the model accepts: the violation is at the next call.
func explain(tb testing.TB, ops []Op) {
	tb.Helper()
	for k := range MaxKeys {
		var sub []Op
		for _, op := range ops {
			if op.In.Key == k {
				sub = append(sub, op)
			}
		}
		if len(sub) == 0 {
			continue
		}
		res, info := Check(sub, time.Minute)
		if res != porcupine.Illegal {
			continue
		}
		for _, part := range info.PartialLinearizationsOperations() {
			if len(part) == 0 {
				continue
			}
			tb.Logf("key k%d: the longest order the model accepts (%d of %d calls); no call can come next:", k, len(part[0]), len(sub))
			for _, op := range part[0] {
				tb.Logf("  [%d,%d] client %d: %s", op.Call, op.Return, op.ClientId, Describe(op.Input.(Input), op.Output.(Output)))
			}
		}
	}
}

// clock orders calls in real time across clients.
type clock struct{ n atomic.Int64 }

func (c *clock) tick() int64 { return c.n.Add(1) }

type client struct {
	id   int
	rng  *rand.Rand
	env  *Env
	cfg  *Config
	keys []string
	clk  *clock

	lease  *storekit.Fence
	zombie bool             // the lease was found lost; the handler finishes anyway
	old    []storekit.Fence // fences this client held: stale (or not) writes
	seen   []storekit.Fence // processing records read by Get: Release targets
	n      int
	// committed: the handler holding lease committed its transaction
	// itself and went on (Env.CommitThenFinish); its calls run on the
	// context of that lease, as a handler's do (the store finds the
	// committed transaction through it).
	committed storekit.Lease

	kills *atomic.Int32
	wg    *sync.WaitGroup
	ops   []Op
}

func runHistory(ctx context.Context, cfg Config, h int, env *Env) ([]Op, int) {
	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	var (
		clk   clock
		kills atomic.Int32
		kwg   sync.WaitGroup
		cwg   sync.WaitGroup
	)
	clients := make([]*client, cfg.Clients)
	for i := range clients {
		clients[i] = &client{
			id: i, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(h)<<16|uint64(i))),
			env: env, cfg: &cfg, keys: keys, clk: &clk, kills: &kills, wg: &kwg,
		}
	}
	start := make(chan struct{})
	for _, c := range clients {
		cwg.Go(func() {
			<-start
			for range cfg.OpsPerClient {
				c.maybeKill(ctx)
				c.step(ctx)
				// An in-memory store answers in microseconds: without a
				// yield, one client could run all its calls before the
				// next is scheduled, and the history would barely
				// interleave.
				runtime.Gosched()
			}
			if c.committed != nil && c.env.CommitWithoutMark && c.lease != nil {
				// Its handler committed itself and has not finished: it
				// does now (it holds the lease's connection until then).
				c.owner()
			}
		})
	}
	close(start)
	cwg.Wait()
	kwg.Wait()
	var ops []Op
	end := clk.tick()
	for _, c := range clients {
		for _, op := range c.ops {
			if op.Out.Res == Unknown {
				// May take effect at any time after its call.
				op.Return = math.MaxInt64 - end + op.Call
			}
			ops = append(ops, op)
		}
	}
	return ops, int(kills.Load())
}

func (c *client) maybeKill(ctx context.Context) {
	if c.env.Kill == nil || c.cfg.KillEvery == 0 || c.rng.IntN(c.cfg.KillEvery) != 0 {
		return
	}
	if int(c.kills.Add(1)) > c.cfg.MaxKills {
		c.kills.Add(-1)
		return
	}
	// Concurrently with this client's next call and the others' calls.
	c.wg.Go(func() { _ = c.env.Kill(ctx) })
}

func (c *client) chance(pct int) bool { return c.rng.IntN(100) < pct }

func (c *client) pick(fs []storekit.Fence) (storekit.Fence, bool) {
	if len(fs) == 0 {
		return storekit.Fence{}, false
	}
	return fs[c.rng.IntN(len(fs))], true
}

// stale picks a fence this client held, most often its latest (whose
// record is likeliest to be in another owner's hands now).
func (c *client) stale() (storekit.Fence, bool) {
	if len(c.old) > 0 && c.chance(60) {
		return c.old[len(c.old)-1], true
	}
	return c.pick(c.old)
}

// do runs one call and records it.
func (c *client) do(in Input, call func(ctx context.Context) (Output, error)) Output {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	op := Op{Client: c.id, In: in, Call: c.clk.tick()}
	out, err := call(ctx)
	op.Return = c.clk.tick()
	if err != nil {
		op.Err = err.Error()
	}
	op.Out = out
	c.ops = append(c.ops, op)
	return out
}

func (c *client) key(k int) string { return c.keys[k] }

func (c *client) keyIndex(key string) int {
	for i, k := range c.keys {
		if k == key {
			return i
		}
	}
	return -1
}

func (c *client) step(ctx context.Context) {
	c.n++
	if c.lease != nil {
		c.owner()
		return
	}
	r := c.rng.IntN(100)
	switch {
	case r < 40:
		c.claim()
	case r < 50:
		c.get()
	case r < 62:
		if f, ok := c.stale(); ok {
			c.fenced(f, []Kind{Heartbeat, Complete, Fail, SaveStep, LoadSteps}[c.rng.IntN(5)])
		} else {
			c.claim()
		}
	case r < 76:
		c.lapse(Lapse)
	case r < 86:
		c.lapse(Expire)
	case r < 94:
		c.release()
	default:
		if c.env.Audit != nil {
			c.audit()
		} else {
			c.get()
		}
	}
}

// owner acts as the handler holding c.lease.
func (c *client) owner() {
	f := *c.lease
	r := c.rng.IntN(100)
	if c.zombie || c.committed != nil && c.env.CommitWithoutMark {
		// Complete or Fail: a lost lease's handler finishes; so does one
		// that committed itself on a store without commit marks, whose
		// crash the contract does not cover (Env.CommitWithoutMark).
		r = 60 + c.rng.IntN(33)
	}
	// A handler runs a while (steps, heartbeats) before it finishes, so
	// that other clients' lapses and takeovers overtake it.
	switch {
	case r < 22:
		c.fenced(f, Heartbeat)
	case r < 50:
		c.fenced(f, SaveStep)
	case r < 60:
		c.fenced(f, LoadSteps)
	case r < 82:
		c.fenced(f, Complete)
	case r < 93:
		c.fenced(f, Fail)
	case c.env.CommitSelf != nil && c.committed == nil && c.chance(50):
		// The handler committed its transaction itself, then the process
		// crashed: the lease is left to lapse, and nobody uses it again.
		// Or (CommitThenFinish) the handler goes on.
		lease := storetest.NewLease(c.env.Store, f)
		in := Input{Kind: CommitCrash, Key: c.keyIndex(f.Key), Tok: f.Token, NoMark: c.env.CommitWithoutMark}
		out := c.do(in, func(ctx context.Context) (Output, error) {
			if err := c.env.CommitSelf(storetest.ContextWithLease(ctx, lease), f); err != nil {
				return Output{Res: Unknown}, err
			}
			return Output{Res: OK}, nil
		})
		if c.env.CommitWithoutMark || c.env.CommitThenFinish && out.Res == OK && c.chance(50) {
			c.committed = lease
			return
		}
		c.lease, c.zombie = nil, false
	default:
		// The process crashed: the lease is left to lapse.
		c.drop()
	}
}

func (c *client) drop() {
	if c.lease != nil {
		if c.committed == nil {
			// A handler that committed its transaction itself is not
			// replayed as a stale writer: a stale Complete or Fail comes
			// with a business write of its own, which it has no more.
			c.old = append(c.old, *c.lease)
		}
		c.lease, c.zombie, c.committed = nil, false, nil
	}
}

func (c *client) claim() {
	k := c.rng.IntN(len(c.keys))
	fp := "A"
	if c.chance(15) {
		fp = "B"
	}
	in := Input{Kind: Claim, Key: k, FP: fp}
	out := c.do(in, func(ctx context.Context) (Output, error) {
		res, err := c.env.Store.Claim(ctx, storekit.ClaimRequest{
			Scope: c.env.Scope, Key: c.key(k), Method: "POST", Route: "/model", Fingerprint: fp,
			Lease: Lease, Retention: Retention,
		})
		if err != nil {
			return Output{Res: Unknown}, err
		}
		return Output{Res: OK, Claimed: res.Claimed, Fresh: res.Fresh, Rec: view(res.Record)}, nil
	})
	if out.Res == OK && out.Claimed {
		c.lease = &storekit.Fence{Scope: c.env.Scope, Key: c.key(k), Token: out.Rec.Tok}
		if c.chance(50) {
			c.fenced(*c.lease, LoadSteps) // a takeover resumes from the stored steps
		}
	}
	// A claim whose answer was lost leaves a lease nobody knows: a crash.
}

func view(r storekit.Record) View {
	v := View{Status: r.Status, Tok: r.Token, FP: r.Fingerprint}
	if r.Response != nil {
		v.Resp = respID(r.Response)
	}
	return v
}

// respID is the identity of a stored response: its body, checked against
// the status and header it was stored with.
func respID(r *storekit.StoredResponse) string {
	id := string(r.Body)
	if r.NotRetained && r.Status == http.StatusInternalServerError && id == "" && len(r.Header) == 0 {
		return NotRetainedResp
	}
	if r.Status != http.StatusCreated || r.Header.Get("X-Resp") != id || r.NotRetained {
		return "corrupt:" + strconv.Itoa(r.Status) + ":" + r.Header.Get("X-Resp") + ":" + id
	}
	return id
}

// result maps a fenced call's error: ErrLeaseLost changed nothing; any
// other error may or may not have taken effect.
func result(err error) Result {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, core.ErrLeaseLost):
		return LeaseLost
	case errors.Is(err, storekit.ErrNotCommitted):
		return NotCommitted
	default:
		return Unknown
	}
}

func (c *client) fenced(f storekit.Fence, kind Kind) {
	k := c.keyIndex(f.Key)
	in := Input{Kind: kind, Key: k, Tok: f.Token}
	s := c.env.Store
	ss, steps := storekit.As[storekit.StepStore](s)
	if (kind == SaveStep || kind == LoadSteps) && !steps {
		kind = Heartbeat
		in.Kind = kind
	}
	// A handler that committed its transaction itself has no ledger write
	// left: idem completes or fails a lease whose writes are committed.
	var committed storekit.Lease
	if c.lease != nil && *c.lease == f {
		committed = c.committed
	}
	tx := c.env.BusinessWrite != nil && (kind == Complete || kind == Fail) && committed == nil
	in.Tx = tx
	in.Ended = tx && c.env.HandlerEndsTx != nil && c.env.HandlerEndsTx(f)
	in.NoMark = committed != nil && c.env.CommitWithoutMark
	switch kind {
	case Complete:
		in.Resp = fmt.Sprintf("c%d.%d", c.id, c.n)
	case SaveStep:
		in.Step = c.rng.IntN(len(StepNames))
		in.Val = fmt.Sprintf("v%d.%d", c.id, c.n)
	}
	out := c.do(in, func(ctx context.Context) (Output, error) {
		if committed != nil {
			ctx = storetest.ContextWithLease(ctx, committed)
		}
		if tx {
			ctx = storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
			if err := c.env.BusinessWrite(ctx, f); err != nil {
				// The handler's write failed: it answers 500, and the
				// engine aborts (Fail rolls the transaction back).
				if kind == Complete {
					ferr := s.Fail(ctx, f)
					return Output{Res: Unknown}, errors.Join(err, ferr)
				}
			}
		}
		var err error
		switch kind {
		case Heartbeat:
			err = s.Heartbeat(ctx, f, Lease)
		case Complete:
			err = s.Complete(ctx, f, storekit.StoredResponse{
				Status: http.StatusCreated, Header: http.Header{"X-Resp": {in.Resp}}, Body: []byte(in.Resp),
			})
		case Fail:
			err = s.Fail(ctx, f)
		case SaveStep:
			err = ss.SaveStep(ctx, f, StepNames[in.Step], []byte(in.Val))
		case LoadSteps:
			var got map[string][]byte
			got, err = ss.LoadSteps(ctx, f)
			if err == nil {
				var st Steps
				for i, name := range StepNames {
					if v, ok := got[name]; ok {
						st[i] = string(v)
						if st[i] == "" {
							st[i] = "<empty>"
						}
					}
				}
				if len(got) > len(StepNames) {
					st[0] += "<extra>"
				}
				return Output{Res: OK, Steps: st}, nil
			}
		}
		return Output{Res: result(err)}, err
	})
	if c.lease != nil && *c.lease == f {
		switch {
		case kind == Complete || kind == Fail:
			c.drop()
		case out.Res == LeaseLost && c.chance(30):
			c.drop() // taken over or released: the handler gives up
		case out.Res == LeaseLost:
			// It runs on as a zombie (a handler that ignores its context's
			// end): the engine still commits or aborts it soon, and that
			// write must be refused.
			c.zombie = true
		}
	}
}

func (c *client) get() {
	k := c.rng.IntN(len(c.keys))
	out := c.do(Input{Kind: Get, Key: k}, func(ctx context.Context) (Output, error) {
		r, err := c.env.Store.Get(ctx, c.env.Scope, c.key(k))
		switch {
		case errors.Is(err, storekit.ErrNotFound):
			return Output{Res: NotFound}, nil
		case err != nil:
			return Output{Res: Unknown}, err
		}
		return Output{Res: OK, Rec: view(r)}, nil
	})
	if out.Res == OK && out.Rec.Status == storekit.StatusProcessing {
		c.seen = append(c.seen, storekit.Fence{Scope: c.env.Scope, Key: c.key(k), Token: out.Rec.Tok})
	}
}

func (c *client) lapse(kind Kind) {
	all := c.env.LapseAll != nil
	fn := c.env.Lapse
	if kind == Expire {
		fn = c.env.Expire
	}
	if !all && fn == nil {
		c.get()
		return
	}
	k := c.rng.IntN(len(c.keys))
	in := Input{Kind: kind, Key: k}
	if all {
		in.Key = AllKeys
	}
	c.do(in, func(ctx context.Context) (Output, error) {
		if all {
			if kind == Expire {
				c.env.ExpireAll()
			} else {
				c.env.LapseAll()
			}
			return Output{Res: OK}, nil
		}
		if err := fn(ctx, c.env.Scope, c.key(k)); err != nil {
			return Output{Res: Unknown}, err
		}
		return Output{Res: OK}, nil
	})
}

func (c *client) release() {
	adm, ok := storekit.As[storekit.Admin](c.env.Store)
	if !ok {
		c.get()
		return
	}
	f, ok := c.pick(append(append([]storekit.Fence{}, c.seen...), c.old...))
	if !ok {
		c.get()
		return
	}
	in := Input{Kind: Release, Key: c.keyIndex(f.Key), Tok: f.Token, Live: c.chance(40)}
	c.do(in, func(ctx context.Context) (Output, error) {
		err := adm.Release(ctx, f, in.Live)
		switch {
		case err == nil:
			return Output{Res: OK}, nil
		case errors.Is(err, storekit.ErrLeaseLive), errors.Is(err, core.ErrLeaseLost), errors.Is(err, storekit.ErrNotFound):
			return Output{Res: Refused}, nil
		}
		return Output{Res: Unknown}, err
	})
}

func (c *client) audit() {
	k := c.rng.IntN(len(c.keys))
	c.do(Input{Kind: Audit, Key: k}, func(ctx context.Context) (Output, error) {
		toks, err := c.env.Audit(ctx, c.env.Scope, c.key(k))
		if err != nil {
			return Output{Res: Unknown}, err
		}
		var s string
		for i, t := range toks {
			if i > 0 {
				s += ","
			}
			s += strconv.FormatInt(t, 10)
		}
		return Output{Res: OK, Ledger: s}, nil
	})
}
