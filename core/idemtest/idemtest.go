package idemtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// Route is one endpoint the adapter must serve through its idem middleware.
type Route struct {
	// Method and Path, e.g. "POST", "/pay". Path is also the route template
	// (it has no parameters).
	Method, Path string
	// Handler is a neutral handler; adapters mount it natively (gin.WrapH,
	// echo.WrapHandler, a fiber wrapper that keeps the user context).
	Handler http.Handler
}

// Adapter knows how to serve routes through one framework's idem middleware.
type Adapter struct {
	Name string
	// Serve starts a real HTTP server on 127.0.0.1 (httptest.Server, or a
	// listener for fiber) serving routes through the adapter's middleware
	// built on eng, with the adapter's scope option reading the request
	// header ScopeHeader, and returns its base URL. It registers cleanup
	// (server shutdown) with t.Cleanup.
	Serve func(t *testing.T, eng *core.Engine, routes []Route) (baseURL string)
	// ServeConfig is Serve with the variations the cross-adapter scenarios
	// need (see Config). When the adapter's constructor fails, it returns
	// that error and serves nothing. Required: Run fails without it.
	ServeConfig func(t *testing.T, eng *core.Engine, routes []Route, cfg Config) (baseURL string, err error)
	// NoHandlerErrors: the framework has no way for a handler to report an
	// error other than writing a response (net/http); the handler-error
	// scenario checks nothing then.
	NoHandlerErrors bool
	// FrameworkLog: ServeConfig honours Config.Log with the framework's
	// request logger, which writes a line per request (the sentinel
	// scenario then requires that it wrote something).
	FrameworkLog bool
}

// Config varies how ServeConfig builds the adapter's middleware. The zero
// Config is Serve's.
type Config struct {
	// NoScope: build without the adapter's scope option.
	NoScope bool
	// ScopeErr: the scope function returns this error for every request.
	ScopeErr error
	// SilentErrorHandler: install an error handler (WithErrorHandler) that
	// writes nothing and returns nil.
	SilentErrorHandler bool
	// ErrorHandlerSaw, when set, is called by that error handler (silent or
	// not) with the error it got.
	ErrorHandlerSaw func(err error)
	// NilOptions: also pass a nil Option and every option the adapter has
	// with a nil argument, before the scope option.
	NilOptions bool
	// HandlerError: each route's native handler first runs Route.Handler
	// with a writer that discards what it writes, then reports HandlerError
	// the framework's way (gin: c.Error; echo, fiber: return it) and writes
	// nothing.
	HandlerError error
	// Log, when set, receives the framework's own logging, mounted the way
	// the framework teaches, outside the idem middleware: its request
	// logger (gin.LoggerWithWriter, echo's middleware.Logger, fiber's
	// logger), its panic recovery (gin.RecoveryWithWriter, echo's Recover,
	// fiber's recover) and the server's error log (net/http). The sentinel
	// scenario searches it for keys.
	Log io.Writer
}

// ScopeHeader is the request header the adapter's scope option must read:
// its value is the record's scope (tenant).
const ScopeHeader = "X-Tenant"

// KeyHeader is the idempotency key header the suite sends (the engine's
// default).
const KeyHeader = "Idempotency-Key"

// ErrStoreDown is what FailingStore returns when Err is nil.
var ErrStoreDown = errors.New("idemtest: store down")

// FailingStore wraps a store and fails every Claim with Err (ErrStoreDown
// when nil), as an unreachable database would. The other methods are the
// wrapped store's.
type FailingStore struct {
	core.Store
	Err error
}

// Claim fails without touching the wrapped store.
func (s FailingStore) Claim(ctx context.Context, _ storekit.ClaimRequest) (storekit.ClaimResult, error) {
	err := s.Err
	if err == nil {
		err = ErrStoreDown
	}
	return storekit.ClaimResult{}, fmt.Errorf("idemtest: claim: %w", err)
}

// countingStore counts Claim calls and, while a scenario holds them
// (holdInFlight), keeps every in-flight answer (a Claim that found the key
// processing and did not take it) from the engine until released. A
// request's claims are sequential, so the answers held at once are as many
// as the distinct requests told the key is in flight: the duplicates that
// then wait. Scenarios release a blocked handler only once they all are.
type countingStore struct {
	core.Store
	claims atomic.Int64

	mu   sync.Mutex
	hold chan struct{} // closed by the release holdInFlight returns; nil when not holding
	held int           // in-flight answers held right now
}

func (s *countingStore) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	s.claims.Add(1)
	res, err := s.Store.Claim(ctx, req)
	if err != nil || res.Claimed || res.Record.Status != storekit.StatusProcessing {
		return res, err
	}
	s.mu.Lock()
	hold := s.hold
	if hold == nil {
		s.mu.Unlock()
		return res, err
	}
	s.held++
	s.mu.Unlock()
	timer := time.NewTimer(waitTimeout) // bounded: a scenario that fails never releases
	select {
	case <-hold:
	case <-ctx.Done():
	case <-timer.C:
	}
	timer.Stop()
	s.mu.Lock()
	s.held--
	s.mu.Unlock()
	return res, err
}

// holdInFlight makes Claim hold in-flight answers until release is
// called (release is idempotent).
func (s *countingStore) holdInFlight() (release func()) {
	hold := make(chan struct{})
	s.mu.Lock()
	s.hold = hold
	s.mu.Unlock()
	return sync.OnceFunc(func() {
		s.mu.Lock()
		s.hold = nil
		s.mu.Unlock()
		close(hold)
	})
}

// heldInFlight is the number of in-flight answers held right now: of
// distinct requests, each waiting for its answer.
func (s *countingStore) heldInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// countingWatcher is countingStore for a store that is also a
// storekit.Watcher: wrapping must not hide the capability from the engine.
type countingWatcher struct {
	*countingStore
	w storekit.Watcher
}

func (s countingWatcher) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	return s.w.Watch(ctx, scope, key)
}

// Run runs every scenario against adapter, each with a fresh store from
// newStore. Scenario names are stable; see the package documentation.
func Run(t *testing.T, a Adapter, newStore func(t *testing.T) core.Store) {
	t.Helper()
	if a.Serve == nil && a.ServeConfig == nil {
		t.Fatal("idemtest: Adapter.Serve and ServeConfig are nil")
	}
	if a.ServeConfig == nil {
		t.Fatal("idemtest: Adapter.ServeConfig is nil (the cross-adapter scenarios need it)")
	}
	if newStore == nil {
		t.Fatal("idemtest: newStore is nil")
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			sc.run(t, &env{t: t, adapter: a, newStore: newStore})
		})
	}
}

type scenario struct {
	name string
	run  func(t *testing.T, e *env)
}

// Bounds on every wait, so a broken adapter fails instead of hanging.
const (
	clientTimeout = 20 * time.Second
	waitTimeout   = 10 * time.Second
	handlerBlock  = 15 * time.Second
)

// env is one scenario's world: its store, engine, server and client.
type env struct {
	t        *testing.T
	adapter  Adapter
	newStore func(t *testing.T) core.Store

	store  *countingStore
	eng    *core.Engine
	base   string
	client *http.Client
	id     string // unique per scenario: keys and tenants never collide
}

// start builds the engine on a fresh store (wrapped by wrap, if not nil)
// and serves routes.
func (e *env) start(routes []Route, wrap func(core.Store) core.Store, opts ...core.Option) {
	e.t.Helper()
	if err := e.startConfig(Config{}, routes, wrap, opts...); err != nil {
		e.t.Fatalf("idemtest: serve: %v", err)
	}
}

// startConfig is start with a Config; it returns the adapter's
// construction error.
func (e *env) startConfig(cfg Config, routes []Route, wrap func(core.Store) core.Store, opts ...core.Option) error {
	t := e.t
	t.Helper()
	inner := e.newStore(t)
	if inner == nil {
		t.Fatal("idemtest: newStore returned nil")
	}
	e.store = &countingStore{Store: inner}
	var s core.Store = e.store
	if w, ok := inner.(storekit.Watcher); ok {
		s = countingWatcher{countingStore: e.store, w: w}
	}
	if wrap != nil {
		s = wrap(s)
	}
	eng, err := core.New(s, opts...)
	if err != nil {
		t.Fatalf("idemtest: core.New: %v", err)
	}
	e.eng = eng
	e.id = randID()
	tr := &http.Transport{MaxIdleConns: 200, MaxIdleConnsPerHost: 200, IdleConnTimeout: 30 * time.Second}
	e.client = &http.Client{Transport: tr, Timeout: clientTimeout}
	var base string
	if e.adapter.ServeConfig != nil {
		base, err = e.adapter.ServeConfig(t, eng, routes, cfg)
		if err != nil {
			return err
		}
	} else {
		base = e.adapter.Serve(t, eng, routes)
	}
	// Registered after Serve's cleanup, so it runs first (LIFO).
	t.Cleanup(tr.CloseIdleConnections)
	e.base = strings.TrimRight(base, "/")
	if e.base == "" {
		t.Fatal("idemtest: Serve returned an empty base URL")
	}
	return nil
}

func randID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// key returns a key unique to this scenario.
func (e *env) key(name string) string { return "k-" + e.id + "-" + name }

// tenant returns a tenant unique to this scenario.
func (e *env) tenant(name string) string { return "t-" + e.id + "-" + name }

// result is a response read in full.
type result struct {
	status int
	header http.Header
	body   []byte
}

func (r *result) String() string {
	b := r.body
	if len(b) > 200 {
		b = b[:200]
	}
	return fmt.Sprintf("%d %q", r.status, b)
}

// call describes one request.
type call struct {
	method, path string
	key          string   // sent as one Idempotency-Key line unless empty
	keys         []string // sent as several lines (overrides key)
	tenant       string
	body         string
	header       http.Header
}

// send performs c and reads the response. Safe from any goroutine: it
// returns errors instead of failing the test.
func (e *env) send(c call) (*result, error) {
	var body io.Reader = http.NoBody
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, e.base+c.path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	switch {
	case c.keys != nil:
		req.Header[KeyHeader] = c.keys
	case c.key != "":
		req.Header.Set(KeyHeader, c.key)
	}
	if c.tenant != "" {
		req.Header.Set(ScopeHeader, c.tenant)
	}
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", c.method, c.path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading body: %w", c.method, c.path, err)
	}
	return &result{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// do is send that fails the test on a transport error. Test goroutine only.
func (e *env) do(c call) *result {
	e.t.Helper()
	r, err := e.send(c)
	if err != nil {
		e.t.Fatalf("idemtest: %v", err)
	}
	return r
}

// sendAll sends n copies of c concurrently (released together) and
// returns the results in completion order on the channel, which is closed
// when all are done. Errors come back as results with status -1 and the
// error text as body.
func (e *env) sendAll(n int, c call) <-chan *result {
	out := make(chan *result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := e.send(c)
			if err != nil {
				r = &result{status: -1, body: []byte(err.Error())}
			}
			out <- r
		}()
	}
	close(start)
	go func() { wg.Wait(); close(out) }()
	return out
}

// gate is a release channel for blocking handlers. Handlers block until
// it opens, or handlerBlock at most; Open is idempotent.
type gate struct {
	once    sync.Once
	ch      chan struct{}
	entered chan struct{} // one value per handler entry (buffered)
}

func newGate() *gate {
	return &gate{ch: make(chan struct{}), entered: make(chan struct{}, 1024)}
}

func (g *gate) Open() { g.once.Do(func() { close(g.ch) }) }

// block is called by handlers.
func (g *gate) block() {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.ch:
	case <-time.After(handlerBlock):
	}
}

// waitEntered waits for a handler to enter; false on timeout.
func (g *gate) waitEntered(d time.Duration) bool {
	select {
	case <-g.entered:
		return true
	case <-time.After(d):
		return false
	}
}

// openOnCleanup makes sure blocked handlers are released before the
// server shuts down. Call it after start (cleanups run last-in first-out).
func (e *env) openOnCleanup(g *gate) { e.t.Cleanup(g.Open) }

// waitUntil polls cond until it holds or d passes.
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // the poll interval: cond decides, not the sleep
	}
}

// problem checks that r is an RFC 9457 problem with the given status and
// type name (a core/problem name).
func requireProblem(t *testing.T, r *result, status int, name string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status = %d, want %d (%s); response %v", r.status, status, name, r)
		return
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("%s: Content-Type = %q, want application/problem+json", name, ct)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Errorf("%s: body is not JSON: %v; %q", name, err, r.body)
		return
	}
	if !strings.HasSuffix(p.Type, "/"+name) {
		t.Errorf("problem type = %q, want a URI ending in /%s", p.Type, name)
	}
	if p.Status != status {
		t.Errorf("problem status member = %d, want %d", p.Status, status)
	}
	if p.Title == "" {
		t.Errorf("%s: problem title is empty", name)
	}
}

// replayed reports whether r carries Idempotent-Replayed: true.
func replayed(r *result) bool {
	return strings.EqualFold(r.header.Get(core.ReplayedHeader), "true")
}

// sameResponse checks that replay reproduces first: status, body byte for
// byte, and every allow-listed header.
func sameResponse(t *testing.T, first, replay *result) {
	t.Helper()
	if replay.status != first.status {
		t.Errorf("replay status = %d, want %d", replay.status, first.status)
	}
	if !bytes.Equal(replay.body, first.body) {
		t.Errorf("replay body = %q, want %q", trunc(replay.body), trunc(first.body))
	}
	for _, h := range ReplayHeaders() {
		if got, want := replay.header.Values(h), first.header.Values(h); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("replay header %s = %q, want %q", h, got, want)
		}
	}
	if !replayed(replay) {
		t.Errorf("replay lacks %s: true; headers %v", core.ReplayedHeader, replay.header)
	}
	if replayed(first) {
		t.Errorf("first response carries %s", core.ReplayedHeader)
	}
}

func trunc(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}

// retryAfter checks that r has an integer Retry-After >= 1.
func retryAfter(t *testing.T, r *result) {
	t.Helper()
	v := r.header.Get("Retry-After")
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Errorf("Retry-After = %q, want an integer >= 1", v)
	}
}

// record reads (scope, key) back from the store.
func (e *env) record(scope, key string) (storekit.Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	return e.store.Get(ctx, scope, key)
}

// ReplayHeaders returns the response headers an engine with the default
// policy keeps and replays (core.Policy.ReplayHeaders).
func ReplayHeaders() []string {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		return nil
	}
	return eng.Policy().ReplayHeaders
}
