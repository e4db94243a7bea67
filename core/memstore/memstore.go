package memstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// ErrFull is returned (wrapped) by Claim when the store holds its maximum
// of unexpired records (WithMaxEntries, DefaultMaxEntries by default) and
// the claim would need a new one.
var ErrFull = errors.New("memstore: store full")

// errTokensExhausted guards the int64 token counter; unreachable in practice,
// but a wrapped token would break fencing silently, so it is an error.
var errTokensExhausted = errors.New("memstore: lease tokens exhausted")

// recKey identifies a record. A struct key (rather than scope+sep+key)
// cannot collide whatever bytes the scope or key contain.
type recKey struct {
	scope, key string
}

// Store is an in-process core.Store. It is safe for concurrent use. The zero
// value is an empty store with the default options, like New().
type Store struct {
	clock      func() time.Time
	maxEntries int // 0 (the zero Store): DefaultMaxEntries; < 0: unbounded

	mu   sync.Mutex
	recs map[recKey]*entry
	// last is the last lease token handed out. One counter for the whole
	// store keeps tokens strictly increasing and never reused, even when a
	// record is deleted and created again under the same key.
	last int64
	// purgeAfter is a lower bound on when any record held can next expire
	// (zero: unknown). A full store rejects new keys without rescanning the
	// whole map before then, so that being full stays cheap.
	purgeAfter time.Time
	// watchers wakes duplicates waiting on a key (storekit.Watcher). A watch's
	// channel is closed exactly when it is removed from this map.
	watchers map[recKey]map[*watch]struct{}
}

type watch struct {
	ch chan struct{}
}

var (
	_ core.Store         = (*Store)(nil)
	_ storekit.Watcher   = (*Store)(nil)
	_ storekit.StepStore = (*Store)(nil)
)

// New returns an empty Store.
func New(opts ...Option) *Store {
	cfg := config{clock: time.Now}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	return &Store{
		clock:      cfg.clock,
		maxEntries: cfg.maxEntries,
		recs:       make(map[recKey]*entry),
		watchers:   make(map[recKey]map[*watch]struct{}),
	}
}

// limit is the maximum number of records, 0 for unbounded.
func (s *Store) limit() int {
	switch {
	case s.maxEntries == 0:
		return DefaultMaxEntries
	case s.maxEntries < 0:
		return 0
	}
	return s.maxEntries
}

// now reads the store clock; a zero Store has none and uses time.Now.
func (s *Store) now() time.Time {
	if s.clock == nil {
		return time.Now()
	}
	return s.clock()
}

// expired reports whether r is past retention and not held by a live lease:
// such a record is treated as absent by every method (the key is new again).
func expired(r *entry, now time.Time) bool {
	if now.Before(r.ExpiresAt) {
		return false
	}
	return !(r.Status == storekit.StatusProcessing && now.Before(r.LockedUntil))
}

// lookupLocked returns the record for k, removing it first if it expired
// (lazy expiry), so every method sees the same answer whatever order calls
// arrive in. s.mu must be held.
func (s *Store) lookupLocked(k recKey, now time.Time) (*entry, bool) {
	r, ok := s.recs[k]
	if !ok {
		return nil, false
	}
	if expired(r, now) {
		s.deleteLocked(k)
		return nil, false
	}
	return r, true
}

// deleteLocked removes the record k and wakes its watchers. s.mu must be held.
func (s *Store) deleteLocked(k recKey) {
	delete(s.recs, k)
	s.notifyLocked(k)
}

// notifyLocked wakes every watcher of k: the record changed. s.mu must be
// held.
func (s *Store) notifyLocked(k recKey) {
	ws, ok := s.watchers[k]
	if !ok {
		return
	}
	for w := range ws {
		close(w.ch)
	}
	delete(s.watchers, k)
}

// expiresBy returns when r would expire if nothing touched it again: a
// processing record is held until its lease lapses too.
func expiresBy(r *entry) time.Time {
	if r.Status == storekit.StatusProcessing && r.LockedUntil.After(r.ExpiresAt) {
		return r.LockedUntil
	}
	return r.ExpiresAt
}

// noteExpiryLocked keeps purgeAfter a lower bound after r changed in a way
// that may make it expire sooner. s.mu must be held.
func (s *Store) noteExpiryLocked(r *entry) {
	if t := expiresBy(r); t.Before(s.purgeAfter) {
		s.purgeAfter = t
	}
}

func (s *Store) nextTokenLocked() (int64, error) {
	if s.last == math.MaxInt64 {
		return 0, errTokensExhausted
	}
	s.last++
	return s.last, nil
}

// Claim implements core.Store. It inserts a processing record when (scope,
// key) has none or only an expired one, takes over a failed record or one
// whose lease lapsed when method, route and fingerprint match, and otherwise
// returns the existing record unchanged. It fails with an error wrapping
// ErrFull when a new record would exceed the bound (WithMaxEntries), and
// rejects a non-positive Lease or Retention.
func (s *Store) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Checked under the lock so a context cancelled while waiting for it
	// still changes nothing.
	if err := ctx.Err(); err != nil {
		return storekit.ClaimResult{}, fmt.Errorf("memstore: claim: %w", err)
	}
	if req.Lease <= 0 {
		return storekit.ClaimResult{}, fmt.Errorf("memstore: claim: lease %v must be positive", req.Lease)
	}
	if req.Retention <= 0 {
		return storekit.ClaimResult{}, fmt.Errorf("memstore: claim: retention %v must be positive", req.Retention)
	}
	now := s.now()
	k := recKey{req.Scope, req.Key}
	r, ok := s.lookupLocked(k, now)
	switch {
	case !ok:
		if bound := s.limit(); bound > 0 && len(s.recs) >= bound {
			if !now.Before(s.purgeAfter) {
				s.purgeLocked(now)
			}
			if len(s.recs) >= bound {
				return storekit.ClaimResult{}, fmt.Errorf("memstore: claim: %w (%d live records)", ErrFull, len(s.recs))
			}
		}
		tok, err := s.nextTokenLocked()
		if err != nil {
			return storekit.ClaimResult{}, fmt.Errorf("memstore: claim: %w", err)
		}
		r = &entry{Record: storekit.Record{
			Scope:       req.Scope,
			Key:         req.Key,
			Method:      req.Method,
			Route:       req.Route,
			Fingerprint: req.Fingerprint,
			Status:      storekit.StatusProcessing,
			Token:       tok,
			LockedUntil: now.Add(req.Lease),
			CreatedAt:   now,
			ExpiresAt:   now.Add(req.Retention),
		}}
		if s.recs == nil { // zero Store
			s.recs = make(map[recKey]*entry)
		}
		s.recs[k] = r
		s.noteExpiryLocked(r)
		s.notifyLocked(k)
		return storekit.ClaimResult{Claimed: true, Record: copyRecord(r), Now: now, Fresh: true}, nil

	case r.Method == req.Method && r.Route == req.Route && r.Fingerprint == req.Fingerprint &&
		(r.Status == storekit.StatusFailed ||
			(r.Status == storekit.StatusProcessing && !now.Before(r.LockedUntil))):
		tok, err := s.nextTokenLocked()
		if err != nil {
			return storekit.ClaimResult{}, fmt.Errorf("memstore: claim: %w", err)
		}
		// CreatedAt is kept: it is when the key was first used, which is
		// what an operator looking at a retried request wants to see.
		r.Status = storekit.StatusProcessing
		r.Token = tok
		r.LockedUntil = now.Add(req.Lease)
		r.ExpiresAt = now.Add(req.Retention)
		r.resp, r.full = storedResp{}, nil
		s.noteExpiryLocked(r)
		s.notifyLocked(k)
		return storekit.ClaimResult{Claimed: true, Record: copyRecord(r), Now: now}, nil

	default:
		return storekit.ClaimResult{Record: copyRecord(r), Now: now}, nil
	}
}

// ownedLocked returns the record f owns: present, not expired, processing
// and carrying f.Token. s.mu must be held.
func (s *Store) ownedLocked(f storekit.Fence, now time.Time) (*entry, bool) {
	r, ok := s.lookupLocked(recKey{f.Scope, f.Key}, now)
	if !ok || r.Status != storekit.StatusProcessing || r.Token != f.Token {
		return nil, false
	}
	return r, true
}

// Heartbeat implements core.Store. A processing record whose lease lapsed
// but which nobody took over may still be extended: the token, not the
// clock, decides ownership.
func (s *Store) Heartbeat(ctx context.Context, f storekit.Fence, extend time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: heartbeat: %w", err)
	}
	if extend <= 0 {
		return fmt.Errorf("memstore: heartbeat: extension %v must be positive", extend)
	}
	now := s.now()
	r, ok := s.ownedLocked(f, now)
	if !ok {
		return fmt.Errorf("memstore: heartbeat: %w", core.ErrLeaseLost)
	}
	r.LockedUntil = now.Add(extend)
	s.notifyLocked(recKey{f.Scope, f.Key})
	return nil
}

// Complete implements core.Store. resp is copied; the caller may reuse it.
func (s *Store) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	// Copy before taking the lock: a 1 MiB body should not be copied while
	// every other request waits.
	stored := compact(&resp)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: complete: %w", err)
	}
	r, ok := s.ownedLocked(f, s.now())
	if !ok {
		return fmt.Errorf("memstore: complete: %w", core.ErrLeaseLost)
	}
	r.Status = storekit.StatusCompleted
	r.resp, r.full = stored, nil
	r.steps = nil         // no one takes a completed record over: its steps are moot
	s.noteExpiryLocked(r) // no longer held by its lease
	s.notifyLocked(recKey{f.Scope, f.Key})
	return nil
}

// Fail implements core.Store.
func (s *Store) Fail(ctx context.Context, f storekit.Fence) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: fail: %w", err)
	}
	r, ok := s.ownedLocked(f, s.now())
	if !ok {
		return fmt.Errorf("memstore: fail: %w", core.ErrLeaseLost)
	}
	r.Status = storekit.StatusFailed
	r.resp, r.full = storedResp{}, nil
	s.noteExpiryLocked(r)
	s.notifyLocked(recKey{f.Scope, f.Key})
	return nil
}

// Get implements core.Store. An expired record is removed on access and
// reported as ErrNotFound, consistently with Claim treating its key as new.
func (s *Store) Get(ctx context.Context, scope, key string) (storekit.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return storekit.Record{}, fmt.Errorf("memstore: get: %w", err)
	}
	r, ok := s.lookupLocked(recKey{scope, key}, s.now())
	if !ok {
		return storekit.Record{}, fmt.Errorf("memstore: get: %w", storekit.ErrNotFound)
	}
	return copyRecord(r), nil
}

// Purge removes every record past its ExpiresAt that is not held by a live
// lease and reports how many it removed. Expired records are also dropped
// lazily when accessed, so Purge only bounds the memory held by keys that
// are never seen again; call it periodically in long-running processes.
func (s *Store) Purge(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("memstore: purge: %w", err)
	}
	return s.purgeLocked(s.now()), nil
}

func (s *Store) purgeLocked(now time.Time) int {
	n := 0
	var next time.Time
	for k, r := range s.recs {
		if expired(r, now) {
			s.deleteLocked(k)
			n++
			continue
		}
		if t := expiresBy(r); next.IsZero() || t.Before(next) {
			next = t
		}
	}
	s.purgeAfter = next
	return n
}

// Watch implements storekit.Watcher: the returned channel is closed at the next
// change to (scope, key) — a claim, takeover, heartbeat, completion,
// failure or removal — or when ctx is done or release is called, whichever
// comes first. A heartbeat changes nothing a waiter acts on, so that
// wake-up is spurious but harmless; no change is ever missed. release may
// be called any number of times.
func (s *Store) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	k := recKey{scope, key}
	w := &watch{ch: make(chan struct{})}
	s.mu.Lock()
	if ctx.Err() != nil {
		s.mu.Unlock()
		close(w.ch)
		return w.ch, func() {}
	}
	if s.watchers == nil { // zero Store
		s.watchers = make(map[recKey]map[*watch]struct{})
	}
	ws, ok := s.watchers[k]
	if !ok {
		ws = make(map[*watch]struct{})
		s.watchers[k] = ws
	}
	ws[w] = struct{}{}
	s.mu.Unlock()

	// A waiter that forgets to release must not leak its watch past its
	// request; AfterFunc starts no goroutine until ctx is done.
	stop := context.AfterFunc(ctx, func() { s.unwatch(k, w) })
	return w.ch, func() {
		stop()
		s.unwatch(k, w)
	}
}

// unwatch removes w, closing its channel, unless a change already did.
func (s *Store) unwatch(k recKey, w *watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws, ok := s.watchers[k]
	if !ok {
		return
	}
	if _, ok := ws[w]; !ok {
		return
	}
	delete(ws, w)
	close(w.ch)
	if len(ws) == 0 {
		delete(s.watchers, k)
	}
}

// Len returns the number of records held, including expired ones that have
// not been removed yet.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// entry is a record as the store holds it: the storekit.Record (its Response
// always nil) and the completed response in compact form.
type entry struct {
	storekit.Record
	resp storedResp
	// full is resp expanded, built by the first read that needs it and
	// then handed to every reader (records are read-only for callers, see
	// core.Store); nil until then, and again whenever resp changes. The
	// compact form is what a record costs the garbage collector until it
	// is replayed.
	full *storekit.StoredResponse
	// steps holds the results of the handler's steps (storekit.StepStore,
	// step.go), kept across takeovers; nil until the first one.
	steps map[string][]byte
}

// storedResp is a completed record's response, the store's own copy. Its
// headers are a slice rather than an http.Header: a map costs a group of
// eight slots (~330 B) per record kept, a slice a few dozen bytes. The
// first Claim or Get that returns it expands it (entry.full), and every
// later one shares that.
type storedResp struct {
	ok          bool // a response is stored
	status      int
	notRetained bool
	body        []byte        // nil when empty
	header      []headerField // nil for a nil http.Header
}

// headerField is one header name and its values; the values of all fields
// share one backing array.
type headerField struct {
	name string
	vals []string
}

// copyRecord returns r as handed to callers: the record by value and the
// shared, expanded response. s.mu must be held.
func copyRecord(r *entry) storekit.Record {
	out := r.Record
	if r.resp.ok {
		if r.full == nil {
			r.full = r.resp.expand()
		}
		out.Response = r.full
	}
	return out
}

// compact copies resp into the store's form. An empty body is stored as
// nil: the contract replays nil and empty alike.
func compact(resp *storekit.StoredResponse) storedResp {
	out := storedResp{ok: true, status: resp.Status, notRetained: resp.NotRetained}
	if len(resp.Body) > 0 {
		out.body = append([]byte(nil), resp.Body...)
	}
	if resp.Header == nil {
		return out
	}
	nv := 0
	for _, vv := range resp.Header {
		nv += len(vv)
	}
	sv := make([]string, nv)
	out.header = make([]headerField, 0, len(resp.Header))
	for k, vv := range resp.Header {
		f := headerField{name: k}
		if vv != nil { // nil and empty values stay apart, as in Header.Clone
			n := copy(sv, vv)
			f.vals, sv = sv[:n:n], sv[n:]
		}
		out.header = append(out.header, f)
	}
	return out
}

// expand returns r as a storekit.StoredResponse, as completed (what
// http.Header.Clone made of the header). It shares r's body and values:
// neither is ever modified.
func (r *storedResp) expand() *storekit.StoredResponse {
	out := &storekit.StoredResponse{Status: r.status, NotRetained: r.notRetained, Body: r.body}
	if r.header == nil {
		return out
	}
	out.Header = make(http.Header, len(r.header))
	for _, f := range r.header {
		out.Header[f.name] = f.vals // nil stays nil; others are capped
	}
	return out
}
