package core

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/core/internal/rerun"
	"github.com/idemkit/idem/core/storekit"
)

// Recovery points (steps).
//
// A handler with several side effects (reserve stock, charge a card, send a
// notification) marks each with Step. The first owner of a key runs the
// step's function and stores its result, fenced by its lease token, before
// Step returns; an owner that takes the key over after a crash (or after a
// retryable failure) gets the stored result back and does not run the
// function again. This is Brandur Leach's "atomic phases" with the
// idempotency record as the recovery point.

// stepSaveTimeout bounds the store write of a step's result. The write runs
// on a context detached from the handler's cancellation: once the effect
// happened, recording it matters even if the client went away.
const stepSaveTimeout = 5 * time.Second

// stepStoreOf finds the StepStore behind s, looking through decorators.
func stepStoreOf(s Store) storekit.StepStore {
	ss, _ := storekit.As[storekit.StepStore](s)
	return ss
}

// WithStepsRequired makes New refuse a store that does not keep steps
// (storekit.StepStore, found through decorators), for services whose handlers use Step: the error
// then comes at start-up rather than at the first Step. Default false:
// any store is accepted, and Step fails with ErrStepsUnsupported.
func WithStepsRequired(on bool) Option {
	return optionFunc(func(c *config) { c.stepsRequired = on })
}

// Step runs fn at most once per (scope, key, name) across every owner of
// the handler's key, and returns its result.
//
// ctx must be the handler's context (see Decision.Context). Under a lease:
//   - if a previous owner of this key stored a result for name (it crashed
//     or failed after the step), Step returns that result and fn does not
//     run;
//   - otherwise fn runs; if it fails, its error is returned as is and
//     nothing is stored (the next attempt runs it again); if it succeeds,
//     its result is stored, fenced by the lease token, durably, before Step
//     returns. A stale owner (its lease was taken over) cannot store: Step
//     returns an error wrapping ErrLeaseLost, and the new owner runs fn
//     itself.
//
// Within one execution a name runs once: a second Step with the same name
// returns the first result; concurrent calls with one name wait for each
// other. Distinct names may run concurrently.
//
// Step names are part of the handler's contract, like the route: an owner
// running a newer release resumes from the steps an older one stored, so a
// name must keep its meaning (and its result's encoding) across releases;
// give a changed step a new name.
//
// A retryable outcome (5xx, a handler error, a panic) keeps the completed
// steps, so the retry resumes after them; a final response ends the record
// as without steps; a request with another payload under the same key is
// refused (422) before any step runs; steps expire with their record.
//
// The limit: a crash after fn's effect and before its result is stored
// repeats the effect once on takeover. Pass the downstream service a key
// derived with RelayKey so it deduplicates that repeat (the second wall).
//
// Outside a lease (a bypassed request, a handler run without idem) fn just
// runs. Under a lease granted by a store without storekit.StepStore, Step returns
// ErrStepsUnsupported and fn does not run. A name that is empty, longer
// than storekit.MaxStepNameBytes, not UTF-8 or with control characters fails with
// ErrStepName; a result larger than MaxStepBytes with ErrStepTooLarge (fn
// has run). A nil result is stored and returned as an empty one. The
// returned slice is the caller's.
func Step(ctx context.Context, name string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	if err := checkStepName(name); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("idem: step %q: nil function", name)
	}
	lease, ok := leaseFrom(ctx)
	if !ok {
		out, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		if len(out) > MaxStepBytes {
			// Checked without a lease too, so a handler tested without
			// idem fails the same way as in production.
			return nil, fmt.Errorf("idem: step %q: %d bytes: %w", name, len(out), ErrStepTooLarge)
		}
		return out, nil
	}
	ss := stepStoreOf(lease.store)
	if ss == nil {
		return nil, fmt.Errorf("idem: step %q: %w", name, ErrStepsUnsupported)
	}
	st := stepsOf(lease)
	unlock := st.lockName(name)
	defer unlock()

	if out, ok, err := st.stored(ctx, ss, lease, name); err != nil || ok {
		return out, err
	}
	if ctx.Err() != nil {
		// Do not start an effect on a context that is over (the client
		// left, or the heartbeat found the lease gone).
		return nil, fmt.Errorf("idem: step %q: not run: %w", name, context.Cause(ctx))
	}
	out, err := fn(ctx)
	if err != nil {
		return nil, err
	}
	if len(out) > MaxStepBytes {
		return nil, fmt.Errorf("idem: step %q: %d bytes: %w", name, len(out), ErrStepTooLarge)
	}
	if out == nil {
		out = []byte{}
	}
	kept := append([]byte{}, out...) // fn's slice stays fn's
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepSaveTimeout)
	defer cancel()
	stored, value := name, kept
	withRequest := lease.kept != nil && st.takeRequest()
	if withRequest {
		// The first step stored carries the request a completer needs
		// (keep.go), in the same write.
		stored, value = rerun.Prefix+name, rerun.Wrap(lease.kept, kept)
	}
	if err := ss.SaveStep(sctx, lease.fence, stored, value); err != nil {
		if withRequest {
			st.giveRequest()
		}
		return nil, fmt.Errorf("idem: step %q: save: %w", name, err)
	}
	st.put(name, kept)
	return out, nil
}

// StepJSON is Step for a value of any type, stored as its JSON encoding:
// on resumption the stored JSON is decoded into a T. The encoding is part of
// the step's contract (see Step): keep T's JSON form compatible across
// releases. A value that does not encode, or a stored value that does not
// decode into T, is an error.
func StepJSON[T any](ctx context.Context, name string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if fn == nil {
		return zero, fmt.Errorf("idem: step %q: nil function", name)
	}
	b, err := Step(ctx, name, func(ctx context.Context) ([]byte, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("idem: step %q: encode result: %w", name, err)
		}
		return b, nil
	})
	if err != nil {
		return zero, err
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return zero, fmt.Errorf("idem: step %q: decode stored result: %w", name, err)
	}
	return v, nil
}

func checkStepName(name string) error {
	if name == "" || len(name) > storekit.MaxStepNameBytes || !utf8.ValidString(name) {
		return fmt.Errorf("%w: must be 1 to %d bytes of UTF-8", ErrStepName, storekit.MaxStepNameBytes)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character %U", ErrStepName, r)
		}
	}
	return nil
}

// stepsKey is the lease attachment holding an execution's step state.
type stepsKey struct{}

// stepState is one execution's view of its steps: the results known so far
// (loaded from the store once, then each stored step), and a lock per name
// so that one name runs once even when called concurrently.
type stepState struct {
	mu      sync.Mutex
	loaded  bool // results holds what the store had at the first Step
	results map[string][]byte
	names   map[string]*stepLock
	// request: a stored step carries the kept request, or one being
	// stored will (keep.go).
	request bool
}

// takeRequest reports whether the caller is to store the kept request with
// its step: none is stored or being stored.
func (s *stepState) takeRequest() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.request {
		return false
	}
	s.request = true
	return true
}

// giveRequest undoes takeRequest after a failed save.
func (s *stepState) giveRequest() {
	s.mu.Lock()
	s.request = false
	s.mu.Unlock()
}

type stepLock struct {
	ch    chan struct{} // a one-slot semaphore
	users int
}

func stepsOf(l *grant) *stepState {
	v, _ := l.Attach(stepsKey{}, func() (any, error) {
		// A claim that created the record (ClaimResult.Fresh) cannot have
		// steps yet: no read needed.
		return &stepState{loaded: l.fresh, results: map[string][]byte{}}, nil
	})
	return v.(*stepState)
}

// lockName serialises the Steps of one name; it returns the unlock.
func (s *stepState) lockName(name string) func() {
	s.mu.Lock()
	if s.names == nil {
		s.names = map[string]*stepLock{}
	}
	l, ok := s.names[name]
	if !ok {
		l = &stepLock{ch: make(chan struct{}, 1)}
		s.names[name] = l
	}
	l.users++
	s.mu.Unlock()
	l.ch <- struct{}{}
	return func() {
		<-l.ch
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.names, name)
		}
		s.mu.Unlock()
	}
}

// stored returns the result known for name, loading the record's steps
// from the store at the first Step of a resumed execution.
func (s *stepState) stored(ctx context.Context, ss storekit.StepStore, l *grant, name string) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock() // held across the load: every Step needs its answer
	if !s.loaded {
		got, err := ss.LoadSteps(ctx, l.fence)
		if err != nil {
			return nil, false, fmt.Errorf("idem: step %q: load steps: %w", name, err)
		}
		for k, v := range got {
			if name, ok := strings.CutPrefix(k, rerun.Prefix); ok {
				if _, result, ok := rerun.Unwrap(v); ok {
					k, v, s.request = name, result, true
				}
			}
			s.results[k] = v
		}
		s.loaded = true
	}
	out, ok := s.results[name]
	if !ok {
		return nil, false, nil
	}
	return append([]byte{}, out...), true, nil
}

func (s *stepState) put(name string, result []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.results[name] = result
}
