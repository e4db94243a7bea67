package echoidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/echoidem"
)

// server is one test's Echo app behind a real listener, with its own client.
type server struct {
	t      *testing.T
	e      *echo.Echo
	eng    *core.Engine
	store  core.Store
	url    string
	client *http.Client
}

// newServer builds an engine on store (memstore when nil) and an Echo app;
// routes are added by the caller before start.
func newServer(t *testing.T, store core.Store, engOpts ...core.Option) *server {
	t.Helper()
	if store == nil {
		store = memstore.New()
	}
	eng, err := core.New(store, append([]core.Option{core.WithSharedKeySpace()}, engOpts...)...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	return &server{t: t, e: e, eng: eng, store: store}
}

func (s *server) start() {
	srv := httptest.NewServer(s.e)
	tr := &http.Transport{MaxIdleConnsPerHost: 200}
	s.client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	s.url = srv.URL
	s.t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
}

// tenantScope is the scope option the tests use: the X-Tenant header.
func tenantScope() echoidem.Option {
	return echoidem.WithScope(func(c echo.Context) (string, error) {
		return c.Request().Header.Get("X-Tenant"), nil
	})
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func (r *result) String() string { return fmt.Sprintf("%d %q %v", r.status, r.body, r.header) }

// send is safe from any goroutine: it returns an error instead of failing.
func (s *server) send(method, path, key, body string, hdr ...string) (*result, error) {
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &result{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// do is send for the test goroutine.
func (s *server) do(method, path, key, body string, hdr ...string) *result {
	s.t.Helper()
	r, err := s.send(method, path, key, body, hdr...)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func isReplay(r *result) bool { return r.header.Get(core.ReplayedHeader) == "true" }

// sameAsFirst checks a replay against the first response: status, body
// byte for byte, every allow-listed header, the replay marker, and no
// Set-Cookie.
func sameAsFirst(t *testing.T, first, replay *result) {
	t.Helper()
	if isReplay(first) {
		t.Errorf("first response is marked replayed: %v", first)
	}
	if !isReplay(replay) {
		t.Errorf("replay is not marked %s: true: %v", core.ReplayedHeader, replay)
	}
	if replay.status != first.status {
		t.Errorf("replay status %d, first %d", replay.status, first.status)
	}
	if !bytes.Equal(replay.body, first.body) {
		t.Errorf("replay body %q, first %q", replay.body, first.body)
	}
	for _, h := range append([]string{"Content-Length"}, core.DefaultReplayHeaders()...) {
		if g, w := replay.header.Values(h), first.header.Values(h); strings.Join(g, "\n") != strings.Join(w, "\n") {
			t.Errorf("replay header %s = %q, first %q", h, g, w)
		}
	}
	if v := replay.header.Values("Set-Cookie"); len(v) != 0 {
		t.Errorf("replay carries Set-Cookie %q", v)
	}
}

// problemType returns the problem type name of a problem+json response.
func problemType(t *testing.T, r *result) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json (%v)", ct, r)
	}
	var p core.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body: %v: %q", err, r.body)
	}
	if p.Status != r.status {
		t.Errorf("problem status %d, response %d", p.Status, r.status)
	}
	return strings.TrimPrefix(p.Type, core.ProblemBaseURI)
}

func TestNativeResponsesReplayIdentically(t *testing.T) {
	type payment struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	cases := []struct {
		name    string
		handler echo.HandlerFunc
		status  int
	}{
		{"JSON", func(c echo.Context) error {
			var in payment
			if err := c.Bind(&in); err != nil {
				return err
			}
			c.Response().Header().Set("Location", "/v1/payments/p_1")
			c.Response().Header().Set("ETag", `"v1"`)
			c.Response().Header().Set("X-Not-Allowed", "per-response")
			c.SetCookie(&http.Cookie{Name: "session", Value: "s3cr3t"})
			return c.JSON(http.StatusCreated, payment{ID: "p_1", Amount: in.Amount})
		}, http.StatusCreated},
		{"String", func(c echo.Context) error {
			c.SetCookie(&http.Cookie{Name: "session", Value: "s3cr3t"})
			return c.String(http.StatusOK, "charged")
		}, http.StatusOK},
		{"NoContent", func(c echo.Context) error {
			c.Response().Header().Set("Location", "/v1/things/1")
			return c.NoContent(http.StatusNoContent)
		}, http.StatusNoContent},
		{"Blob", func(c echo.Context) error {
			return c.Blob(http.StatusAccepted, "application/octet-stream", []byte{0, 1, 2, 0xff})
		}, http.StatusAccepted},
		{"HTTPError", func(echo.Context) error {
			return echo.NewHTTPError(http.StatusBadRequest, "bad")
		}, http.StatusBadRequest},
		{"NothingWritten", func(echo.Context) error { return nil }, http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, nil)
			var runs atomic.Int32
			s.e.POST("/v1/payments", func(c echo.Context) error {
				runs.Add(1)
				return tc.handler(c)
			}, mw(s.eng))
			s.start()

			first := s.do("POST", "/v1/payments", "key-1", `{"amount":1000}`)
			if first.status != tc.status {
				t.Fatalf("first status %d, want %d: %v", first.status, tc.status, first)
			}
			if tc.name == "JSON" || tc.name == "String" {
				if c := first.header.Get("Set-Cookie"); !strings.HasPrefix(c, "session=s3cr3t") {
					t.Errorf("first response Set-Cookie %q", c)
				}
			}
			replay := s.do("POST", "/v1/payments", "key-1", `{"amount":1000}`)
			sameAsFirst(t, first, replay)
			if tc.name == "JSON" {
				if replay.header.Get("X-Not-Allowed") != "" {
					t.Errorf("non-allow-listed header replayed")
				}
				if got := replay.header.Get("Location"); got != "/v1/payments/p_1" {
					t.Errorf("replay Location %q", got)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
			// A different body under the same key is refused.
			mismatch := s.do("POST", "/v1/payments", "key-1", `{"amount":50000}`)
			if mismatch.status != http.StatusUnprocessableEntity || problemType(t, mismatch) != core.ProblemPayloadMismatch {
				t.Errorf("mismatch: %v", mismatch)
			}
		})
	}
}

func TestHTTPErrorStoredAsClientSawIt(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	s.e.POST("/v1/payments", func(echo.Context) error {
		runs.Add(1)
		return echo.NewHTTPError(http.StatusBadRequest, "bad")
	}, mw(s.eng, tenantScope()))
	s.start()

	first := s.do("POST", "/v1/payments", "k", `{}`, "X-Tenant", "acme")
	if first.status != 400 || strings.TrimSpace(string(first.body)) != `{"message":"bad"}` {
		t.Fatalf("first: %v", first)
	}
	rec, err := s.store.Get(context.Background(), "acme", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != storekit.StatusCompleted || rec.Response == nil || rec.Response.Status != 400 ||
		!bytes.Equal(rec.Response.Body, first.body) {
		t.Fatalf("stored %+v, client saw %v", rec.Response, first)
	}
	if rec.Route != "/v1/payments" {
		t.Errorf("stored route %q", rec.Route)
	}
	sameAsFirst(t, first, s.do("POST", "/v1/payments", "k", `{}`, "X-Tenant", "acme"))
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times", runs.Load())
	}
}

func TestCustomHTTPErrorHandlerIsUsed(t *testing.T) {
	s := newServer(t, nil)
	s.e.HTTPErrorHandler = func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		_ = c.String(http.StatusTeapot, "custom: "+err.Error())
	}
	var runs atomic.Int32
	s.e.POST("/x", func(echo.Context) error {
		runs.Add(1)
		return errors.New("boom")
	}, mw(s.eng))
	s.start()
	first := s.do("POST", "/x", "k", "")
	if first.status != http.StatusTeapot || string(first.body) != "custom: boom" {
		t.Fatalf("first: %v", first)
	}
	sameAsFirst(t, first, s.do("POST", "/x", "k", ""))
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times", runs.Load())
	}
}

func TestPlainErrorIsRetryable(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	s.e.POST("/v1/payments", func(c echo.Context) error {
		if runs.Add(1) == 1 {
			return errors.New("x")
		}
		return c.JSON(http.StatusCreated, map[string]string{"id": "p_1"})
	}, mw(s.eng))
	s.start()

	first := s.do("POST", "/v1/payments", "k", `{"amount":1}`)
	if first.status != http.StatusInternalServerError || isReplay(first) {
		t.Fatalf("first: %v", first)
	}
	if !strings.Contains(string(first.body), "Internal Server Error") {
		t.Errorf("first body %q is not echo's 500", first.body)
	}
	second := s.do("POST", "/v1/payments", "k", `{"amount":1}`)
	if second.status != http.StatusCreated || isReplay(second) {
		t.Fatalf("retry: %v", second)
	}
	if runs.Load() != 2 {
		t.Errorf("handler ran %d times, want 2", runs.Load())
	}
	sameAsFirst(t, second, s.do("POST", "/v1/payments", "k", `{"amount":1}`))
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	release := make(chan struct{})
	s.e.POST("/v1/payments", func(c echo.Context) error {
		runs.Add(1)
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		return c.JSON(http.StatusCreated, map[string]string{"id": "p_1"})
	}, mw(s.eng))
	s.start()

	const n = 100
	results := make(chan *result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := s.send("POST", "/v1/payments", "dup", `{"amount":1000}`)
			if err != nil {
				t.Errorf("request: %v", err)
				r = &result{status: -1}
			}
			results <- r
		}()
	}
	close(start)
	var created, conflict, other int
	deadline := time.After(15 * time.Second)
	for i := range n {
		if i == n-1 {
			// Every duplicate has been answered while the owner is blocked.
			close(release)
		}
		var r *result
		select {
		case r = <-results:
		case <-deadline:
			t.Fatalf("timed out after %d responses", i)
		}
		switch r.status {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
			conflict++
			if r.header.Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After")
			}
		default:
			other++
			t.Errorf("unexpected response %v", r)
		}
	}
	wg.Wait()
	if runs.Load() != 1 || created != 1 || conflict != n-1 || other != 0 {
		t.Errorf("runs=%d created=%d conflict=%d other=%d", runs.Load(), created, conflict, other)
	}
}

func TestPanicAnswers500AndKeyIsRetryable(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	var outerSawPanic atomic.Bool
	var outerStatus atomic.Int32
	// An outer recover, as echo's middleware.Recover would sit.
	s.e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			defer func() {
				if p := recover(); p != nil {
					outerSawPanic.Store(true)
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			err = next(c)
			outerStatus.Store(int32(c.Response().Status))
			return err
		}
	})
	s.e.POST("/v1/payments", func(c echo.Context) error {
		if runs.Add(1) == 1 {
			_ = c.JSON(http.StatusCreated, map[string]string{"half": "written"})
			panic("boom")
		}
		return c.JSON(http.StatusCreated, map[string]string{"id": "p_1"})
	}, mw(s.eng))
	s.start()

	first := s.do("POST", "/v1/payments", "k", `{}`)
	if first.status != http.StatusInternalServerError || problemType(t, first) != core.ProblemHandlerPanic {
		t.Fatalf("first: %v", first)
	}
	if outerSawPanic.Load() {
		t.Errorf("panic propagated to the outer middleware")
	}
	if got := outerStatus.Load(); got != http.StatusInternalServerError {
		t.Errorf("outer middleware saw status %d, want 500", got)
	}
	second := s.do("POST", "/v1/payments", "k", `{}`)
	if second.status != http.StatusCreated || isReplay(second) || runs.Load() != 2 {
		t.Fatalf("retry: %v (runs %d)", second, runs.Load())
	}
}

func TestPanicAfterStreamingDropsConnection(t *testing.T) {
	s := newServer(t, nil)
	var outerSaw atomic.Value
	s.e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			defer func() {
				if p := recover(); p != nil {
					outerSaw.Store(fmt.Sprint(p))
					panic(p)
				}
			}()
			return next(c)
		}
	})
	s.e.POST("/stream", func(c echo.Context) error {
		c.Response().WriteHeader(http.StatusOK)
		_, _ = c.Response().Write([]byte("part one"))
		c.Response().Flush()
		panic("mid-stream")
	}, mw(s.eng))
	s.start()

	_, err := s.send("POST", "/stream", "k", "")
	if err == nil {
		t.Errorf("a response cut by a panic arrived whole")
	}
	if got, _ := outerSaw.Load().(string); got != http.ErrAbortHandler.Error() {
		t.Errorf("outer middleware saw panic %q, want http.ErrAbortHandler", got)
	}
	// The key was released: the record is failed, a retry may run again.
	rec, gerr := s.store.Get(context.Background(), "", "k")
	if gerr != nil || rec.Status != storekit.StatusFailed {
		t.Errorf("record %+v, %v; want failed", rec, gerr)
	}
}

func TestStreamedResponseIsNotRetained(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	s.e.POST("/stream", func(c echo.Context) error {
		runs.Add(1)
		c.Response().Header().Set("Content-Type", "text/plain")
		c.Response().WriteHeader(http.StatusOK)
		for i := range 3 {
			_, _ = fmt.Fprintf(c.Response(), "chunk %d\n", i)
			c.Response().Flush()
		}
		return nil
	}, mw(s.eng))
	s.start()
	first := s.do("POST", "/stream", "k", "")
	if first.status != 200 || string(first.body) != "chunk 0\nchunk 1\nchunk 2\n" {
		t.Fatalf("first: %v", first)
	}
	again := s.do("POST", "/stream", "k", "")
	if again.status != http.StatusConflict || problemType(t, again) != core.ProblemNotRetained {
		t.Errorf("retry: %v", again)
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times", runs.Load())
	}
}

func TestSkipper(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	s.e.POST("/webhook", func(c echo.Context) error {
		runs.Add(1)
		return c.String(http.StatusOK, "ok")
	}, mw(s.eng, echoidem.WithSkipper(func(c echo.Context) bool {
		return c.Request().Header.Get("X-Internal") == "1"
	})))
	s.start()

	// Skipped: no key needed, and a key does not deduplicate.
	for range 2 {
		r := s.do("POST", "/webhook", "", "", "X-Internal", "1")
		if r.status != 200 {
			t.Fatalf("skipped request: %v", r)
		}
		r = s.do("POST", "/webhook", "same", "", "X-Internal", "1")
		if r.status != 200 || isReplay(r) {
			t.Fatalf("skipped request with key: %v", r)
		}
	}
	if runs.Load() != 4 {
		t.Errorf("skipped handler ran %d times, want 4", runs.Load())
	}
	// Not skipped: the key is required.
	r := s.do("POST", "/webhook", "", "")
	if r.status != 400 || problemType(t, r) != core.ProblemMissingKey {
		t.Errorf("unskipped request without key: %v", r)
	}
}

func TestScope(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	var scopeCalls atomic.Int32
	auth := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if u := c.Request().Header.Get("X-User-ID"); u != "" {
				c.Set("user", u)
			}
			return next(c)
		}
	}
	mw := mw(s.eng, echoidem.WithScope(func(c echo.Context) (string, error) {
		scopeCalls.Add(1)
		u, ok := c.Get("user").(string)
		if !ok {
			return "", errors.New("no user")
		}
		return u, nil
	}))
	s.e.POST("/pay", func(c echo.Context) error {
		runs.Add(1)
		return c.String(http.StatusCreated, c.Get("user").(string))
	}, auth, mw)
	s.e.GET("/pay", func(c echo.Context) error { return c.String(200, "list") }, auth, mw)
	s.start()

	a := s.do("POST", "/pay", "k", "", "X-User-ID", "alice")
	b := s.do("POST", "/pay", "k", "", "X-User-ID", "bob")
	if a.status != 201 || b.status != 201 || string(a.body) != "alice" || string(b.body) != "bob" || isReplay(b) {
		t.Fatalf("alice %v, bob %v", a, b)
	}
	if runs.Load() != 2 {
		t.Errorf("handler ran %d times, want 2 (one per tenant)", runs.Load())
	}
	anon := s.do("POST", "/pay", "k", "")
	if anon.status != http.StatusUnauthorized || problemType(t, anon) != core.ProblemScopeUnavailable {
		t.Errorf("no user: %v", anon)
	}
	calls := scopeCalls.Load()
	if r := s.do("GET", "/pay", "", ""); r.status != 200 {
		t.Errorf("GET: %v", r)
	}
	if scopeCalls.Load() != calls {
		t.Errorf("scope function called for a bypassed GET")
	}
}

func TestContextBodyAndEchoState(t *testing.T) {
	s := newServer(t, nil)
	type seen struct {
		status    int
		size      int64
		committed bool
		ctxErr    error
		hasLease  bool
	}
	var outer seen
	var mu sync.Mutex
	s.e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Header().Set(echo.HeaderXRequestID, "rid-1")
			err := next(c)
			mu.Lock()
			defer mu.Unlock()
			_, lease := core.LeaseFromContext(c.Request().Context())
			outer = seen{c.Response().Status, c.Response().Size, c.Response().Committed, c.Request().Context().Err(), lease}
			return err
		}
	})
	s.e.POST("/items/:id", func(c echo.Context) error {
		key, ok := core.KeyFromContext(c.Request().Context())
		if !ok {
			return c.String(http.StatusInternalServerError, "no lease in context")
		}
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return err
		}
		rid := c.Response().Header().Get(echo.HeaderXRequestID)
		return c.String(http.StatusCreated, key+"|"+c.Param("id")+"|"+string(body)+"|"+rid)
	}, mw(s.eng))
	s.e.POST("/empty", func(echo.Context) error { return nil }, mw(s.eng))
	s.start()

	r := s.do("POST", "/items/42", "the-key", `{"a":1}`)
	if r.status != 201 || string(r.body) != `the-key|42|{"a":1}|rid-1` {
		t.Fatalf("handler saw: %v", r)
	}
	if r.header.Get(echo.HeaderXRequestID) != "rid-1" {
		t.Errorf("outer header lost: %v", r.header)
	}
	mu.Lock()
	got := outer
	mu.Unlock()
	want := seen{status: 201, size: int64(len(r.body)), committed: true}
	if got != want {
		t.Errorf("outer middleware saw %+v, want %+v", got, want)
	}
	rec, err := s.store.Get(context.Background(), "", "the-key")
	if err != nil || rec.Route != "/items/{id}" {
		t.Errorf("stored route %q (%v), want the canonical template /items/{id}", rec.Route, err)
	}
	// Replay through echo's writer: outer middleware sees it as usual.
	replay := s.do("POST", "/items/42", "the-key", `{"a":1}`)
	sameAsFirst(t, r, replay)
	if replay.header.Get(echo.HeaderXRequestID) != "rid-1" {
		t.Errorf("replay lost the outer header")
	}
	mu.Lock()
	got = outer
	mu.Unlock()
	if got != want {
		t.Errorf("outer middleware saw %+v on replay, want %+v", got, want)
	}

	// A handler that writes nothing: idem sends the empty 200 itself, and
	// echo must know the response is committed (or an outer middleware or
	// the error handler would write a second one).
	r = s.do("POST", "/empty", "empty-key", "")
	mu.Lock()
	got = outer
	mu.Unlock()
	if r.status != 200 || len(r.body) != 0 || got != (seen{status: 200, committed: true}) {
		t.Errorf("empty: client %v, outer middleware saw %+v", r, got)
	}
}

// failStore fails Complete and Fail (the outcome cannot be recorded) or
// Claim (the store is down).
type failStore struct {
	core.Store
	claim, finish bool
}

var errDown = errors.New("store down")

func (f failStore) Claim(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
	if f.claim {
		return storekit.ClaimResult{}, errDown
	}
	return f.Store.Claim(ctx, r)
}

func (f failStore) Complete(ctx context.Context, fe storekit.Fence, r storekit.StoredResponse) error {
	if f.finish {
		return errDown
	}
	return f.Store.Complete(ctx, fe, r)
}

func TestStoreFailures(t *testing.T) {
	for _, tc := range []struct {
		name       string
		store      failStore
		opts       []echoidem.Option
		wantStatus int
		wantBody   string // problem type, or exact body for custom handlers
		wantRuns   int32
	}{
		{"ClaimDefault", failStore{claim: true}, nil, 503, core.ProblemStoreUnavailable, 0},
		{"CommitDefault", failStore{finish: true}, nil, 503, core.ProblemStoreUnavailable, 1},
		{"ClaimCustomWrites", failStore{claim: true}, []echoidem.Option{echoidem.WithErrorHandler(
			func(c echo.Context, err error, fb *adapterkit.Response) error {
				if !errors.Is(err, errDown) || fb.Status != 503 {
					t.Errorf("handler got %v, %d", err, fb.Status)
				}
				return c.String(http.StatusServiceUnavailable, "try later")
			})}, 503, "try later", 0},
		{"CommitCustomReturnsHTTPError", failStore{finish: true}, []echoidem.Option{echoidem.WithErrorHandler(
			func(_ echo.Context, err error, _ *adapterkit.Response) error {
				return echo.NewHTTPError(http.StatusServiceUnavailable, "not recorded").SetInternal(err)
			})}, 503, `{"message":"not recorded"}`, 1},
		{"NilErrorHandlerKeepsDefault", failStore{claim: true}, []echoidem.Option{echoidem.WithErrorHandler(nil), nil},
			503, core.ProblemStoreUnavailable, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.store.Store = memstore.New()
			s := newServer(t, tc.store)
			var runs atomic.Int32
			s.e.POST("/x", func(c echo.Context) error {
				runs.Add(1)
				c.SetCookie(&http.Cookie{Name: "a", Value: "b"})
				return c.JSON(http.StatusCreated, map[string]int{"ok": 1})
			}, mw(s.eng, tc.opts...))
			s.start()
			r := s.do("POST", "/x", "k", "")
			if r.status != tc.wantStatus {
				t.Fatalf("got %v", r)
			}
			if strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
				if pt := problemType(t, r); pt != tc.wantBody {
					t.Errorf("problem %q, want %q", pt, tc.wantBody)
				}
			} else if strings.TrimSpace(string(r.body)) != tc.wantBody {
				t.Errorf("body %q, want %q", r.body, tc.wantBody)
			}
			if r.header.Get("Set-Cookie") != "" {
				t.Errorf("discarded response leaked a header: %v", r.header)
			}
			if runs.Load() != tc.wantRuns {
				t.Errorf("handler ran %d times, want %d", runs.Load(), tc.wantRuns)
			}
		})
	}
}

func TestNilEngineAndNilOptions(t *testing.T) {
	s := newServer(t, nil)
	s.e.POST("/opts", func(c echo.Context) error { return c.String(200, "ran") },
		mw(s.eng, nil, echoidem.WithScope(nil), echoidem.WithSkipper(nil), echoidem.WithErrorHandler(nil)))
	s.start()
	if m, err := echoidem.New(nil, echoidem.WithScope(func(echo.Context) (string, error) { return "u", nil })); err == nil || m != nil {
		t.Errorf("New(nil) = %v, %v, want an error", m, err)
	}
	first := s.do("POST", "/opts", "k", "")
	if first.status != 200 {
		t.Fatalf("nil options: %v", first)
	}
	sameAsFirst(t, first, s.do("POST", "/opts", "k", ""))
}

func TestRequestBodyTooLarge(t *testing.T) {
	s := newServer(t, nil, core.WithMaxRequestBytes(8))
	var runs atomic.Int32
	s.e.POST("/x", func(c echo.Context) error { runs.Add(1); return c.NoContent(204) }, mw(s.eng))
	s.start()
	r := s.do("POST", "/x", "k", `{"far":"too large"}`)
	if r.status != http.StatusRequestEntityTooLarge || problemType(t, r) != core.ProblemBodyTooLarge || runs.Load() != 0 {
		t.Errorf("got %v, runs %d", r, runs.Load())
	}
}

// Hooks registered with c.Response().Before by outer middleware run once per
// response actually sent: during capture (their headers go out with the
// handler's response) and again for a replay written through echo's writer.
func TestResponseBeforeHooks(t *testing.T) {
	s := newServer(t, nil)
	var hooks atomic.Int32
	s.e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Before(func() {
				hooks.Add(1)
				c.Response().Header().Set("X-Served-By", "hook")
			})
			return next(c)
		}
	})
	s.e.POST("/x", func(c echo.Context) error { return c.String(http.StatusCreated, "ok") }, mw(s.eng))
	s.start()
	first := s.do("POST", "/x", "k", "")
	if first.status != 201 || first.header.Get("X-Served-By") != "hook" || hooks.Load() != 1 {
		t.Fatalf("first: %v, hooks %d", first, hooks.Load())
	}
	replay := s.do("POST", "/x", "k", "")
	sameAsFirst(t, first, replay)
	if replay.header.Get("X-Served-By") != "hook" || hooks.Load() != 2 {
		t.Errorf("replay: %v, hooks %d", replay, hooks.Load())
	}
}

// The skipper idiom from the package documentation leaves unrouted
// requests to Echo when the middleware is registered with Echo#Use.
func TestUseWithUnmatchedRouteSkipper(t *testing.T) {
	s := newServer(t, nil)
	s.e.Use(mw(s.eng, echoidem.WithSkipper(func(c echo.Context) bool { return c.Path() == "" })))
	s.e.POST("/x", func(c echo.Context) error { return c.String(http.StatusCreated, "ok") })
	s.start()
	if r := s.do("POST", "/nope", "", ""); r.status != http.StatusNotFound {
		t.Errorf("unrouted: %v", r)
	}
	first := s.do("POST", "/x", "k", "")
	sameAsFirst(t, first, s.do("POST", "/x", "k", ""))
}
