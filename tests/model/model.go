package model

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idem/core/storekit"
)

// Kind is one operation of the protocol.
type Kind uint8

// The operations. The first eight are core.Store, storekit.StepStore and
// storekit.Admin calls; Lapse, Expire and Audit are the test's own steps on the
// store (an operator's UPDATE, or the store's clock moved on; a read of the
// business table).
const (
	Claim Kind = iota + 1
	Heartbeat
	Complete
	Fail
	Get
	SaveStep
	LoadSteps
	Release
	// Lapse ends the lease of a processing record (its owner stopped
	// heartbeating: the process crashed or hangs), as if its LockedUntil
	// had passed.
	Lapse
	// Expire ends a record's retention (and lease): the key is new again.
	Expire
	// Audit reads the tokens whose business write committed (the ledger).
	Audit
	// CommitCrash: the handler holding Tok commits its business
	// transaction itself (its ledger write and the store's commit mark,
	// mysqlstore.Tx), then its process dies before Complete. A takeover of
	// the lapsed lease must then not run the handler again: the claim
	// completes the record as not retained (NotRetainedResp) instead. (Or
	// the handler goes on, Env.CommitThenFinish: its Complete records the
	// response, its Fail completes the record as not retained.) With
	// Input.NoMark the store keeps no commit mark (pgstore): the handler
	// always goes on (Env.CommitWithoutMark), and its Complete or Fail
	// must find out from the database whether its COMMIT landed.
	CommitCrash
)

var kindNames = [...]string{"?", "Claim", "Heartbeat", "Complete", "Fail", "Get", "SaveStep", "LoadSteps", "Release", "Lapse", "Expire", "Audit", "CommitCrash"}

// NotRetainedResp is the identity of a response completed as not retained
// (a 500 nobody kept): what a claim records for a lapsed lease whose
// handler's writes committed.
const NotRetainedResp = "not-retained"

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// MaxKeys is the most keys one history uses.
const MaxKeys = 3

// AllKeys as Input.Key: Lapse or Expire every record at once (a store
// whose clock is moved forward, such as memstore's).
const AllKeys = -1

// StepNames are the step names histories use.
var StepNames = [2]string{"reserve", "charge"}

// Steps holds a record's step results by StepNames index ("" when absent;
// histories store only non-empty results).
type Steps [len(StepNames)]string

// unknownTok is the token of a record created by a claim whose answer was
// lost (a killed connection): some token larger than any seen before,
// fixed by the first read that sees it.
const unknownTok = -1

// Input is one call.
type Input struct {
	Kind Kind
	Key  int    // index of the key in the history, or AllKeys
	FP   string // Claim: the request's fingerprint
	Tok  int64  // fenced calls and Release: the token used
	Resp string // Complete: the response's identity (its body)
	Step int    // SaveStep: index in StepNames
	Val  string // SaveStep: the result
	Live bool   // Release: release even a live lease
	// Tx: Complete or Fail ran in the lease's business transaction after
	// a ledger write under Tok (pgstore.Tx).
	Tx bool
	// Ended: the handler ended that transaction itself before Complete or
	// Fail (`defer tx.Rollback()`): its ledger write rolled back, so a
	// Complete must not record the response (mysqlstore.Tx).
	Ended bool `json:",omitempty"`
	// NoMark: CommitCrash on a store that keeps no commit mark; Complete
	// or Fail of a handler that ran one (Env.CommitWithoutMark).
	NoMark bool `json:",omitempty"`
}

// Result is what a call answered.
type Result uint8

// The results. Every error the contract does not name as "nothing
// changed" is Unknown: the call may or may not have taken effect, at any
// time after it started.
const (
	OK        Result = iota
	LeaseLost        // core.ErrLeaseLost: nothing changed
	NotFound         // Get: storekit.ErrNotFound
	Refused          // Release: ErrLeaseLive, ErrLeaseLost or ErrNotFound: nothing changed
	Unknown
	// NotCommitted: Complete answered storekit.ErrNotCommitted (the handler
	// ended its transaction and its writes rolled back): the response is
	// not recorded and, if the token still owns the key, the key may have
	// been released (the store's best-effort fenced fail).
	NotCommitted
)

var resultNames = [...]string{"ok", "lease-lost", "not-found", "refused", "unknown", "not-committed"}

func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return "Result(" + strconv.Itoa(int(r)) + ")"
}

// View is a record as Claim or Get returned it, reduced to what the
// protocol decides.
type View struct {
	Status storekit.Status
	Tok    int64
	FP     string
	Resp   string // the completed response's identity, "" when none
}

// Output is one call's answer.
type Output struct {
	Res     Result
	Claimed bool // Claim
	Fresh   bool // Claim
	Rec     View
	Steps   Steps  // LoadSteps
	Ledger  string // Audit: the ledger's tokens for the key, ascending, comma-separated
}

// rec is the model's record for one key.
type rec struct {
	present bool
	// expired: past retention with a lapsed lease. Claim treats the key as
	// new, fenced writes fail; Get may still return it (SQL stores) or
	// not (memstore).
	expired bool
	live    bool // processing with a running lease
	status  storekit.Status
	tok     int64
	fp      string
	resp    string
	steps   Steps
	// maxTok is the largest token known to have been handed out for the
	// key: every claim must answer a larger one.
	maxTok int64
	ledger string
	// marks: the tokens whose handler committed its transaction itself
	// (CommitCrash), comma-separated.
	marks string
	// own: the same, on a store that keeps no commit mark (Input.NoMark):
	// they decide the handler's Complete and Fail, but seal no takeover.
	own string
}

// State is the model's state: one record per key of the history.
type State [MaxKeys]rec

// sealed reports whether a claim with fingerprint fp finds a lapsed lease
// whose handler's writes committed (CommitCrash): it completes the record
// as not retained instead of taking it over.
func (r *rec) sealed(fp string) bool {
	return r.present && !r.expired && r.fp == fp && r.status == storekit.StatusProcessing && !r.live && r.marked(r.tok)
}

// marked reports whether the handler holding tok committed its
// transaction itself (CommitCrash).
func (r *rec) marked(tok int64) bool {
	return slices.Contains(strings.Split(r.marks, ","), strconv.FormatInt(tok, 10))
}

// committedSelf reports whether the handler holding tok committed its
// transaction itself, with a commit mark or without (Input.NoMark).
func (r *rec) committedSelf(tok int64) bool {
	return r.marked(tok) || slices.Contains(strings.Split(r.own, ","), strconv.FormatInt(tok, 10))
}

func (r *rec) owned(tok int64) bool {
	return r.present && !r.expired && r.status == storekit.StatusProcessing && r.tok == tok
}

// claimable reports whether a claim with fingerprint fp creates the record
// anew (fresh) or takes it over.
func (r *rec) claimable(fp string) (fresh, takeover bool) {
	if !r.present || r.expired {
		return true, false
	}
	return false, r.fp == fp && (r.status == storekit.StatusFailed || (r.status == storekit.StatusProcessing && !r.live))
}

// sees reports whether v is what a read of r may answer, and returns r with
// an unknown token fixed to v's.
func (r rec) sees(v View) (rec, bool) {
	if v.Status != r.status || v.FP != r.fp || v.Resp != r.resp {
		return r, false
	}
	if r.tok == unknownTok {
		if v.Tok <= r.maxTok {
			return r, false
		}
		r.tok, r.maxTok = v.Tok, v.Tok
		return r, true
	}
	return r, v.Tok == r.tok
}

func addLedger(ledger string, tok int64) string {
	var toks []int64
	for f := range strings.SplitSeq(ledger, ",") {
		if f != "" {
			v, _ := strconv.ParseInt(f, 10, 64)
			toks = append(toks, v)
		}
	}
	toks = append(toks, tok)
	slices.Sort(toks)
	parts := make([]string, len(toks))
	for i, v := range toks {
		parts[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(parts, ",")
}

func with(s State, k int, r rec) State {
	s[k] = r
	return s
}

// step is the protocol: every state the store may be in after the call in,
// answered out, from state s; none when that answer is impossible.
func step(s State, in Input, out Output) []State {
	if in.Key == AllKeys {
		return stepAll(s, in, out)
	}
	if in.Key < 0 || in.Key >= MaxKeys {
		return nil
	}
	k := in.Key
	r := s[k]
	// maybe: an unknown outcome is the state unchanged or changed.
	maybe := func(changed ...rec) []State {
		next := []State{s}
		for _, c := range changed {
			next = append(next, with(s, k, c))
		}
		return next
	}
	switch in.Kind {
	case Claim:
		if r.sealed(in.FP) {
			n := r
			n.status, n.resp, n.live, n.steps = storekit.StatusCompleted, NotRetainedResp, false, Steps{}
			switch {
			case out.Res == Unknown:
				return maybe(n)
			case out.Res != OK || out.Claimed || out.Fresh:
				return nil
			}
			if v, ok := n.sees(out.Rec); ok {
				return []State{with(s, k, v)}
			}
			return nil
		}
		fresh, takeover := r.claimable(in.FP)
		claimed := func(tok int64) rec {
			n := rec{present: true, live: true, status: storekit.StatusProcessing, tok: tok, fp: in.FP, maxTok: r.maxTok, ledger: r.ledger, marks: r.marks, own: r.own}
			if tok > n.maxTok {
				n.maxTok = tok
			}
			if takeover {
				n.steps = r.steps // steps survive a takeover, not a new incarnation
			}
			return n
		}
		switch {
		case out.Res == Unknown:
			if fresh || takeover {
				return maybe(claimed(unknownTok))
			}
			return maybe()
		case out.Res != OK:
			return nil
		case out.Claimed:
			// At most one owner: only a new or claimable record is claimed,
			// under a token larger than any before it, fresh only when new.
			if !fresh && !takeover {
				return nil
			}
			v := out.Rec
			if v.Status != storekit.StatusProcessing || v.FP != in.FP || v.Resp != "" || v.Tok <= r.maxTok || (takeover && out.Fresh) {
				return nil
			}
			return []State{with(s, k, claimed(v.Tok))}
		default:
			// Not claimable: the record is answered unchanged (a replay, an
			// in-flight duplicate, a fingerprint mismatch).
			if fresh || takeover || out.Fresh {
				return nil
			}
			n, ok := r.sees(out.Rec)
			if !ok {
				return nil
			}
			return []State{with(s, k, n)}
		}

	case Heartbeat, Complete, Fail, SaveStep, LoadSteps:
		owned := r.owned(in.Tok)
		n := r
		switch in.Kind {
		case Heartbeat:
			n.live = true
		case Complete:
			n.status, n.resp, n.live, n.steps = storekit.StatusCompleted, in.Resp, false, Steps{}
			if in.Tx {
				n.ledger = addLedger(r.ledger, in.Tok)
			}
		case Fail:
			n.status, n.live = storekit.StatusFailed, false
			if r.committedSelf(in.Tok) {
				// The handler committed its writes itself (CommitCrash, and
				// it went on): failing must not let a retry run it again.
				n.status, n.resp, n.steps = storekit.StatusCompleted, NotRetainedResp, Steps{}
			}
		case SaveStep:
			n.steps[in.Step] = in.Val
		}
		if in.Ended && in.Kind == Complete && out.Res == OK {
			return nil // recorded a response whose writes rolled back
		}
		if in.NoMark && in.Kind == Complete && out.Res == OK && !r.committedSelf(in.Tok) {
			return nil // recorded a response although the handler's COMMIT did not land
		}
		switch out.Res {
		case NotCommitted:
			if in.Kind != Complete || !in.Ended {
				return nil
			}
			if !owned {
				return []State{s}
			}
			f := r
			f.status, f.live = storekit.StatusFailed, false
			return maybe(f)
		case Unknown:
			if !owned || in.Kind == LoadSteps {
				return maybe()
			}
			if in.Kind == Complete && in.Tx {
				// A commit that failed may be followed by the store's own
				// fenced fail (the business writes were rolled back).
				f := r
				f.status, f.live = storekit.StatusFailed, false
				if in.Ended {
					return maybe(f) // the writes rolled back: never recorded
				}
				return maybe(n, f)
			}
			if in.Kind == Complete && in.NoMark {
				// After a handler's own COMMIT (no commit mark): if it
				// landed, a Complete that cannot record the response
				// completes the record as not retained; if it did not
				// (the connection died under it), the key is released.
				if r.committedSelf(in.Tok) {
					nr := n
					nr.resp = NotRetainedResp
					return maybe(n, nr)
				}
				f := r
				f.status, f.live = storekit.StatusFailed, false
				return maybe(f)
			}
			return maybe(n)
		case LeaseLost:
			// A stale token changes nothing.
			if owned {
				return nil
			}
			return []State{s}
		case OK:
			if !owned {
				return nil
			}
			if in.Kind == LoadSteps {
				// A takeover gets back every step stored in this incarnation.
				if out.Steps != r.steps {
					return nil
				}
				return []State{s}
			}
			return []State{with(s, k, n)}
		}
		return nil

	case Get:
		switch out.Res {
		case Unknown:
			return maybe()
		case NotFound:
			if r.present && !r.expired {
				return nil
			}
			return []State{s}
		case OK:
			if !r.present {
				return nil
			}
			n, ok := r.sees(out.Rec)
			if !ok {
				return nil
			}
			return []State{with(s, k, n)}
		}
		return nil

	case Release:
		ok := r.present && r.status == storekit.StatusProcessing && r.tok == in.Tok && (in.Live || !r.live)
		n := r
		n.status, n.live = storekit.StatusFailed, false
		switch out.Res {
		case Unknown:
			if ok {
				return maybe(n)
			}
			return maybe()
		case Refused:
			if ok {
				return nil
			}
			return []State{s}
		case OK:
			if !ok {
				return nil
			}
			return []State{with(s, k, n)}
		}
		return nil

	case Lapse, Expire:
		n := lapse(r, in.Kind == Expire)
		switch out.Res {
		case Unknown:
			return maybe(n)
		case OK:
			return []State{with(s, k, n)}
		}
		return nil

	case CommitCrash:
		// The handler's own COMMIT: no fence, the record is unchanged.
		n := r
		n.ledger = addLedger(r.ledger, in.Tok)
		if in.NoMark {
			n.own = addLedger(r.own, in.Tok)
		} else {
			n.marks = addLedger(r.marks, in.Tok)
		}
		switch out.Res {
		case Unknown:
			return maybe(n)
		case OK:
			return []State{with(s, k, n)}
		}
		return nil

	case Audit:
		switch out.Res {
		case Unknown:
			return maybe()
		case OK:
			if out.Ledger != r.ledger {
				return nil
			}
			return []State{s}
		}
		return nil
	}
	return nil
}

func lapse(r rec, expire bool) rec {
	if !r.present {
		return r
	}
	if expire {
		r.expired, r.live = true, false
	} else if r.status == storekit.StatusProcessing {
		r.live = false
	}
	return r
}

func stepAll(s State, in Input, out Output) []State {
	if in.Kind != Lapse && in.Kind != Expire {
		return nil
	}
	n := s
	for k := range n {
		n[k] = lapse(n[k], in.Kind == Expire)
	}
	switch out.Res {
	case Unknown:
		return []State{s, n}
	case OK:
		return []State{n}
	}
	return nil
}

// Model is the protocol as a porcupine model. Histories are partitioned by
// key unless an operation spans every key.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []any { return []any{State{}} },
		Step: func(state, input, output any) []any {
			next := step(state.(State), input.(Input), output.(Output))
			out := make([]any, len(next))
			for i, n := range next {
				out[i] = n
			}
			return out
		},
		Equal: func(a, b any) bool { return a.(State) == b.(State) },
		Hash: func(state any) uint64 {
			h := fnv.New64a()
			fmt.Fprintf(h, "%v", state.(State))
			return h.Sum64()
		},
		DescribeOperation: func(input, output any) string { return Describe(input.(Input), output.(Output)) },
		DescribeState:     func(state any) string { return describeState(state.(State)) },
	}
	return nm.ToModel()
}

func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[int][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(Input).Key
		if k == AllKeys {
			return [][]porcupine.Operation{history}
		}
		byKey[k] = append(byKey[k], op)
	}
	out := make([][]porcupine.Operation, 0, len(byKey))
	for k := range MaxKeys {
		if ops, ok := byKey[k]; ok {
			out = append(out, ops)
		}
	}
	return out
}

// Describe renders one call and its answer.
func Describe(in Input, out Output) string {
	key := "k" + strconv.Itoa(in.Key)
	if in.Key == AllKeys {
		key = "*"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s(%s", in.Kind, key)
	switch in.Kind {
	case Claim:
		fmt.Fprintf(&b, ", fp=%s", in.FP)
	case Heartbeat, Fail, LoadSteps, CommitCrash:
		fmt.Fprintf(&b, ", tok=%d", in.Tok)
	case Complete:
		fmt.Fprintf(&b, ", tok=%d, resp=%s", in.Tok, in.Resp)
	case SaveStep:
		fmt.Fprintf(&b, ", tok=%d, %s=%s", in.Tok, StepNames[in.Step], in.Val)
	case Release:
		fmt.Fprintf(&b, ", tok=%d, live=%v", in.Tok, in.Live)
	}
	if in.Tx {
		b.WriteString(", tx")
	}
	if in.Ended {
		b.WriteString(", handler-ended")
	}
	fmt.Fprintf(&b, ") -> %s", out.Res)
	if out.Res != OK {
		return b.String()
	}
	switch in.Kind {
	case Claim:
		fmt.Fprintf(&b, " claimed=%v fresh=%v %s", out.Claimed, out.Fresh, describeView(out.Rec))
	case Get:
		b.WriteString(" " + describeView(out.Rec))
	case LoadSteps:
		fmt.Fprintf(&b, " %q", out.Steps)
	case Audit:
		fmt.Fprintf(&b, " ledger=[%s]", out.Ledger)
	}
	return b.String()
}

func describeView(v View) string {
	s := fmt.Sprintf("{%s tok=%d fp=%s", v.Status, v.Tok, v.FP)
	if v.Resp != "" {
		s += " resp=" + v.Resp
	}
	return s + "}"
}

func describeState(s State) string {
	var parts []string
	for k, r := range s {
		if !r.present && r.maxTok == 0 && r.ledger == "" {
			continue
		}
		if !r.present {
			parts = append(parts, fmt.Sprintf("k%d: absent (max tok %d)", k, r.maxTok))
			continue
		}
		tok := strconv.FormatInt(r.tok, 10)
		if r.tok == unknownTok {
			tok = ">" + strconv.FormatInt(r.maxTok, 10)
		}
		p := fmt.Sprintf("k%d: %s tok=%s fp=%s", k, r.status, tok, r.fp)
		if r.live {
			p += " live"
		}
		if r.expired {
			p += " expired"
		}
		if r.resp != "" {
			p += " resp=" + r.resp
		}
		if r.steps != (Steps{}) {
			p += fmt.Sprintf(" steps=%q", r.steps)
		}
		if r.ledger != "" {
			p += " ledger=[" + r.ledger + "]"
		}
		if r.marks != "" {
			p += " marks=[" + r.marks + "]"
		}
		if r.own != "" {
			p += " own=[" + r.own + "]"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}
