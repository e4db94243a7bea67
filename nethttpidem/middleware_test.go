package nethttpidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/nethttpidem"
)

// serve mounts h at pattern through the middleware and returns the server.
func serve(t *testing.T, eng *core.Engine, pattern string, h http.Handler, opts ...nethttpidem.Option) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(pattern, mw(eng, opts...)(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func newEngine(t *testing.T, s core.Store, opts ...core.Option) *core.Engine {
	t.Helper()
	eng, err := core.New(s, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	require.NoError(t, err)
	return eng
}

type resp struct {
	status int
	header http.Header
	body   string
}

// post sends a POST with key (none if empty) and body. Safe from any
// goroutine: errors are returned.
func post(client *http.Client, url, key, body string) (resp, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return resp{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := client.Do(req)
	if err != nil {
		return resp{}, err
	}
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, string(b)}, err
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 128}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 15 * time.Second}
}

func problemType(t *testing.T, body string) string {
	t.Helper()
	var p problem.Details
	require.NoError(t, json.Unmarshal([]byte(body), &p), "body %q", body)
	return p.Type
}

const payBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

// commits returns an engine option and a channel that receives the kind
// of each Commit or Abort (EventCommit, EventFail, EventAbort,
// EventLeaseLost) once the store has recorded it: the engine reports the
// event after the store call returns. A test waits on it instead of
// polling for the record to change. The channel holds 16 events.
func commits() (core.Option, <-chan string) {
	ch := make(chan string, 16)
	return core.WithObserver(func(ev core.Event) {
		switch ev.Kind {
		case core.EventCommit, core.EventFail, core.EventAbort, core.EventLeaseLost:
			ch <- ev.Kind
		}
	}), ch
}

// nextCommit waits for the next event on ch (see commits).
func nextCommit(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case k := <-ch:
		return k
	case <-time.After(10 * time.Second): // a guard against a hang, not a pace
		require.FailNow(t, "no commit or abort recorded within 10s")
		return ""
	}
}

// watchingStore is a memstore that closes waiting once n duplicates
// have started watching their key (storekit.Watcher): with core.WithWait
// a duplicate that found the key in flight watches it before it waits, and
// it watches again only after the record changed.
type watchingStore struct {
	*memstore.Store
	n       int64
	watches atomic.Int64
	waiting chan struct{}
}

func newWatchingStore(n int) *watchingStore {
	return &watchingStore{Store: memstore.New(), n: int64(n), waiting: make(chan struct{})}
}

func (s *watchingStore) Watch(ctx context.Context, scope, key string) (<-chan struct{}, func()) {
	ch, stop := s.Store.Watch(ctx, scope, key)
	if s.watches.Add(1) == s.n {
		close(s.waiting)
	}
	return ch, stop
}

// TestHundredConcurrentIdenticalRequests is issue 2's must-show: 100
// identical requests at once through nethttpidem + memstore run the handler
// exactly once; the others get 409 (or, in wait mode, the replayed 201).
func TestHundredConcurrentIdenticalRequests(t *testing.T) {
	const total = 100
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			var opts []core.Option
			if wait {
				opts = append(opts, core.WithWait(10*time.Second))
			}
			store := newWatchingStore(total - 1)
			eng := newEngine(t, store, opts...)
			var runs atomic.Int64
			release := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(release) }) }
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				select {
				case <-release:
				case <-time.After(10 * time.Second): // a guard: the test opens release
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
			})
			srv := serve(t, eng, "POST /pay", h)
			t.Cleanup(open) // before srv.Close: cleanups run last-in first-out
			client := newClient(t)

			results := make(chan resp, total)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range total {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					r, err := post(client, srv.URL+"/pay", "same-key", payBody)
					if err != nil {
						t.Errorf("request: %v", err)
						r.status = -1
					}
					results <- r
				}()
			}
			close(start)
			if wait {
				// Release the owner once every duplicate has found the key
				// in flight and waits on it.
				select {
				case <-store.waiting:
				case <-time.After(10 * time.Second): // a guard against a hang, not a pace
					t.Errorf("%d of %d duplicates waiting after 10s", store.watches.Load(), total-1)
				}
				open()
			}
			go func() { wg.Wait(); close(results) }()

			var created, conflicts, replays int
			bodies := map[string]int{}
			for r := range results {
				switch r.status {
				case http.StatusCreated:
					created++
					bodies[r.body]++
					if r.header.Get(core.ReplayedHeader) == "true" {
						replays++
					}
				case http.StatusConflict:
					conflicts++
					assert.Equal(t, problem.BaseURI+problem.InFlight, problemType(t, r.body))
					assert.NotEmpty(t, r.header.Get("Retry-After"))
					if conflicts == total-1 {
						open() // every duplicate answered while the owner was blocked
					}
				default:
					t.Errorf("unexpected response %d %q", r.status, r.body)
				}
			}
			open()
			assert.EqualValues(t, 1, runs.Load(), "handler executions")
			if wait {
				assert.Equal(t, total, created, "201 responses")
				assert.Equal(t, total-1, replays, "replayed 201 responses")
				assert.Equal(t, map[string]int{`{"id":"pay_1"}`: total}, bodies)
			} else {
				assert.Equal(t, 1, created, "201 responses")
				assert.Equal(t, total-1, conflicts, "409 responses")
			}
		})
	}
}

// The recorder keeps Unwrap: http.ResponseController reaches the real
// writer for what the recorder does not implement itself.
func TestRecorderUnwrapResponseController(t *testing.T) {
	eng := newEngine(t, memstore.New())
	var sawRecorder atomic.Bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, isRec := w.(*adapterkit.Recorder)
		sawRecorder.Store(isRec)
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
			http.Error(w, "SetWriteDeadline: "+err.Error(), http.StatusInternalServerError)
			return
		}
		if err := rc.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			http.Error(w, "SetReadDeadline: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ok")
	})
	srv := serve(t, eng, "POST /pay", h)
	client := newClient(t)
	r, err := post(client, srv.URL+"/pay", "k1", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, r.status, r.body)
	assert.True(t, sawRecorder.Load(), "handler should write to the capturing recorder")
	// Still stored and replayed: deadlines are not streaming.
	r2, err := post(client, srv.URL+"/pay", "k1", payBody)
	require.NoError(t, err)
	assert.Equal(t, "true", r2.header.Get(core.ReplayedHeader))
	assert.Equal(t, "ok", r2.body)
}

// A flushed response goes out as written and completes as not retained:
// the retry gets 409 not-retained and the handler never runs again.
func TestFlushedResponseNotRetained(t *testing.T) {
	flushers := map[string]func(w http.ResponseWriter) error{
		"http.Flusher": func(w http.ResponseWriter) error {
			f, ok := w.(http.Flusher)
			if !ok {
				return errors.New("writer is not an http.Flusher")
			}
			f.Flush()
			return nil
		},
		"ResponseController": func(w http.ResponseWriter) error { return http.NewResponseController(w).Flush() },
	}
	for name, flush := range flushers {
		t.Run(name, func(t *testing.T) {
			eng := newEngine(t, memstore.New())
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "data: one\n\n")
				if err := flush(w); err != nil {
					t.Errorf("flush: %v", err)
				}
				_, _ = io.WriteString(w, "data: two\n\n")
			})
			srv := serve(t, eng, "POST /events", h)
			client := newClient(t)
			r, err := post(client, srv.URL+"/events", "stream-1", payBody)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, r.status)
			assert.Equal(t, "data: one\n\ndata: two\n\n", r.body)
			assert.Equal(t, "text/event-stream", r.header.Get("Content-Type"))

			r2, err := post(client, srv.URL+"/events", "stream-1", payBody)
			require.NoError(t, err)
			assert.Equal(t, http.StatusConflict, r2.status)
			assert.Equal(t, problem.BaseURI+problem.NotRetained, problemType(t, r2.body))
			assert.EqualValues(t, 1, runs.Load(), "handler executions")
		})
	}
}

// A hijacked connection is never stored either.
func TestHijackedResponseNotRetained(t *testing.T) {
	end, ended := commits()
	eng := newEngine(t, memstore.New(), end)
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack through the recorder: %v", err)
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = rw.WriteString("HTTP/1.1 202 Accepted\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		_ = rw.Flush()
	})
	srv := serve(t, eng, "POST /raw", h)
	client := newClient(t)
	r, err := post(client, srv.URL+"/raw", "hj-1", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusAccepted, r.status)
	assert.Equal(t, "hijacked", r.body)

	// The hijacked bytes reach the client before the handler returns and
	// Commit runs: retry once the commit is recorded.
	require.Equal(t, core.EventCommit, nextCommit(t, ended))
	r2, err := post(client, srv.URL+"/raw", "hj-1", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusConflict, r2.status, r2.body)
	assert.Equal(t, problem.BaseURI+problem.NotRetained, problemType(t, r2.body))
	assert.EqualValues(t, 1, runs.Load())
}

// The handler reads the body Decide consumed; ContentLength and GetBody
// match it.
func TestHandlerGetsBodyBack(t *testing.T) {
	eng := newEngine(t, memstore.New())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read body: %v", err)
		}
		var again []byte
		if r.GetBody != nil {
			rc, err := r.GetBody()
			if err == nil {
				again, _ = io.ReadAll(rc)
			}
		}
		_, _ = fmt.Fprintf(w, "%d|%s|%s", r.ContentLength, b, again)
	})
	srv := serve(t, eng, "POST /echo", h)
	r, err := post(newClient(t), srv.URL+"/echo", "body-1", payBody)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%d|%s|%s", len(payBody), payBody, payBody), r.body)
}

// The route template (r.Pattern) is what is stored and fingerprinted, so
// /items/1 and /items/2 share a route; WithRoute overrides it.
func TestRouteTemplate(t *testing.T) {
	t.Run("pattern", func(t *testing.T) {
		store := memstore.New()
		eng := newEngine(t, store)
		srv := serve(t, eng, "/items/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		}))
		_, err := post(newClient(t), srv.URL+"/items/42", "route-1", "{}")
		require.NoError(t, err)
		rec, err := store.Get(context.Background(), "", "route-1")
		require.NoError(t, err)
		assert.Equal(t, "/items/{id}", rec.Route)
	})
	t.Run("WithRoute", func(t *testing.T) {
		store := memstore.New()
		eng := newEngine(t, store)
		srv := serve(t, eng, "/items/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		}), nethttpidem.WithRoute(func(r *http.Request) string { return "custom:" + r.URL.Path }))
		client := newClient(t)
		_, err := post(client, srv.URL+"/items/1", "route-2", "{}")
		require.NoError(t, err)
		rec, err := store.Get(context.Background(), "", "route-2")
		require.NoError(t, err)
		assert.Equal(t, "custom:/items/1", rec.Route)
		// Same key on another path: another route, so a mismatch.
		r, err := post(client, srv.URL+"/items/2", "route-2", "{}")
		require.NoError(t, err)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status)
	})
}

func TestSkip(t *testing.T) {
	eng := newEngine(t, memstore.New())
	var runs atomic.Int64
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}), nethttpidem.WithSkip(func(r *http.Request) bool { return r.Header.Get("X-Internal") == "1" }))
	client := newClient(t)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payBody))
		req.Header.Set("X-Internal", "1") // no key: would be 400 if not skipped
		res, err := client.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		assert.Equal(t, http.StatusCreated, res.StatusCode)
	}
	assert.EqualValues(t, 2, runs.Load())
	r, err := post(client, srv.URL+"/pay", "", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, r.status, "not skipped: key required")
}

func TestScopeErrorIs401(t *testing.T) {
	eng := newEngine(t, memstore.New())
	var runs atomic.Int64
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }),
		nethttpidem.WithScope(func(*http.Request) (string, error) { return "", errors.New("no user") }))
	r, err := post(newClient(t), srv.URL+"/pay", "k", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnauthorized, r.status)
	assert.Equal(t, problem.BaseURI+problem.ScopeUnavailable, problemType(t, r.body))
	assert.Zero(t, runs.Load())
}

// faultStore injects errors into chosen store methods.
type faultStore struct {
	core.Store
	claimErr, completeErr, failErr error
}

func (s *faultStore) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	if s.claimErr != nil {
		return storekit.ClaimResult{}, s.claimErr
	}
	return s.Store.Claim(ctx, req)
}

func (s *faultStore) Complete(ctx context.Context, f storekit.Fence, r storekit.StoredResponse) error {
	if s.completeErr != nil {
		return s.completeErr
	}
	return s.Store.Complete(ctx, f, r)
}

func (s *faultStore) Fail(ctx context.Context, f storekit.Fence) error {
	if s.failErr != nil {
		return s.failErr
	}
	return s.Store.Fail(ctx, f)
}

func TestErrorHandler(t *testing.T) {
	down := errors.New("db down")
	eng := newEngine(t, &faultStore{Store: memstore.New(), claimErr: down})
	var runs atomic.Int64
	var gotErr error
	var gotStatus int
	var mu sync.Mutex
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }),
		nethttpidem.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error, fallback *adapterkit.Response) {
			mu.Lock()
			gotErr, gotStatus = err, fallback.Status
			mu.Unlock()
			w.WriteHeader(599)
		}))
	r, err := post(newClient(t), srv.URL+"/pay", "k", payBody)
	require.NoError(t, err)
	assert.Equal(t, 599, r.status)
	mu.Lock()
	defer mu.Unlock()
	assert.ErrorIs(t, gotErr, down)
	assert.Equal(t, http.StatusServiceUnavailable, gotStatus)
	assert.Zero(t, runs.Load())
}

// When Commit fails the handler's buffered response never reaches the
// client: a success that was not recorded must not look final.
func TestCommitFailureHidesHandlerResponse(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		wantStatus int
		wantType   string
	}{
		{"store_error", errors.New("db down at commit"), http.StatusServiceUnavailable, problem.StoreUnavailable},
		{"lease_lost", fmt.Errorf("fenced: %w", core.ErrLeaseLost), http.StatusConflict, problem.InFlight},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eng := newEngine(t, &faultStore{Store: memstore.New(), completeErr: tc.err})
			srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Set-Cookie", "leak=1")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"id":"pay_1"}`)
			}))
			r, err := post(newClient(t), srv.URL+"/pay", "k", payBody)
			require.NoError(t, err)
			assert.Equal(t, tc.wantStatus, r.status, r.body)
			assert.Equal(t, problem.BaseURI+tc.wantType, problemType(t, r.body))
			assert.Empty(t, r.header.Get("Set-Cookie"), "the handler's headers must not leak into the problem")
			assert.NotEmpty(t, r.header.Get("Retry-After"))
		})
	}
}

// A client that goes away while the handler waits on the context does not
// strand the key: the empty, abandoned response is treated as an abort and
// a retry runs the handler.
func TestClientDisconnectReleasesKey(t *testing.T) {
	end, ended := commits()
	eng := newEngine(t, memstore.New(), end)
	var runs atomic.Int64
	started := make(chan struct{})
	done := make(chan struct{}, 2)
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
				t.Errorf("handler context not cancelled on client disconnect")
			}
			done <- struct{}{}
			return // writes nothing
		}
		w.WriteHeader(http.StatusCreated)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(payBody))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "gone")
	client := newClient(t)
	sent := make(chan error, 1)
	go func() {
		res, err := client.Do(req)
		if err == nil {
			_ = res.Body.Close()
		}
		sent <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second): // a guard against a hang, not a pace
		t.Fatal("handler never ran")
	}
	cancel() // the client goes away while the handler waits
	require.Error(t, <-sent)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never returned")
	}
	// The abort is recorded right after the handler returns: retry then.
	require.Equal(t, core.EventAbort, nextCommit(t, ended))
	r, err := post(newClient(t), srv.URL+"/pay", "gone", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, r.status, r.body)
	assert.EqualValues(t, 2, runs.Load())
}

// panic(http.ErrAbortHandler) keeps its net/http meaning (drop the
// connection) and still releases the key.
func TestAbortHandlerPanic(t *testing.T) {
	eng := newEngine(t, memstore.New())
	var runs atomic.Int64
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	client := newClient(t)
	_, err := post(client, srv.URL+"/pay", "abort", payBody)
	require.Error(t, err, "connection should be dropped")
	r, err := post(client, srv.URL+"/pay", "abort", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, r.status)
	assert.EqualValues(t, 2, runs.Load())
}

// A panic after the response started streaming cannot be replaced by a
// problem: the connection is dropped; the key is released.
func TestPanicAfterFlush(t *testing.T) {
	eng := newEngine(t, memstore.New())
	var runs atomic.Int64
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			_, _ = io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	client := newClient(t)
	_, err := post(client, srv.URL+"/pay", "pf", payBody)
	require.Error(t, err, "a half-sent response must end in a broken connection, not look complete")
	r, err := post(client, srv.URL+"/pay", "pf", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, r.status)
}

func TestNilEngine(t *testing.T) {
	m, err := nethttpidem.New(nil, nethttpidem.WithScope(func(*http.Request) (string, error) { return "u", nil }))
	assert.Error(t, err)
	assert.Nil(t, m)
}

// Statuses without a body replay as such.
func TestReplayNoContent(t *testing.T) {
	eng := newEngine(t, memstore.New())
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"x"`)
		w.WriteHeader(http.StatusNoContent)
	}))
	client := newClient(t)
	r1, err := post(client, srv.URL+"/pay", "nc", payBody)
	require.NoError(t, err)
	r2, err := post(client, srv.URL+"/pay", "nc", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusNoContent, r1.status)
	assert.Equal(t, http.StatusNoContent, r2.status)
	assert.Equal(t, "true", r2.header.Get(core.ReplayedHeader))
	assert.Equal(t, `"x"`, r2.header.Get("ETag"))
	assert.Empty(t, r2.body)
}

// Informational responses go straight out; the final response is stored.
func TestEarlyHints(t *testing.T) {
	eng := newEngine(t, memstore.New())
	srv := serve(t, eng, "POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "done")
	}))
	client := newClient(t)
	r1, err := post(client, srv.URL+"/pay", "eh", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, r1.status)
	assert.Equal(t, "done", r1.body)
	r2, err := post(client, srv.URL+"/pay", "eh", payBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, r2.status)
	assert.Equal(t, "done", r2.body)
	assert.Equal(t, "true", r2.header.Get(core.ReplayedHeader))
}

// Through a real ServeMux with a path parameter: the same key and body on
// another order is refused, not answered with the first order's response.
func TestPathParameterIsPartOfTheRequest(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	require.NoError(t, err)
	var runs atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/confirm", mw(eng)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "confirmed "+r.PathValue("id"))
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	post := func(path string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "same-key")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := post("/orders/1/confirm")
	assert.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "confirmed 1", body)
	code, _ = post("/orders/2/confirm")
	assert.Equal(t, http.StatusUnprocessableEntity, code)
	code, body = post("/orders/1/confirm")
	assert.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "confirmed 1", body)
	assert.Equal(t, int32(1), runs.Load())
}
