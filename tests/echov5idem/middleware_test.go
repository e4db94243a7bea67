package echov5idem_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echov5idem"
)

// TestRouteTemplateIsCanonical: the route recorded is echo's registered
// path in idem's canonical form, the one every adapter records for the
// same route, not the request path.
func TestRouteTemplateIsCanonical(t *testing.T) {
	cases := []struct{ register, target, want string }{
		{"/v1/orders/:id/confirm", "/v1/orders/7/confirm", "/v1/orders/{id}/confirm"},
		{"/files/*", "/files/a/b", "/files/{*}"},
		{"/v1/things\\:batch", "/v1/things:batch", "/v1/things\\:batch"},
	}
	for _, tc := range cases {
		t.Run(tc.register, func(t *testing.T) {
			eng, store := newEngine(t)
			e := echo.New()
			e.Use(mw(t, eng))
			e.POST(tc.register, func(c *echo.Context) error { return c.NoContent(http.StatusCreated) })
			if w := serve(e, http.MethodPost, tc.target, "k", strings.NewReader("{}")); w.Code != http.StatusCreated {
				t.Fatalf("POST %s: %d %q", tc.target, w.Code, w.Body.String())
			}
			rec, err := store.Get(t.Context(), "", "k")
			if err != nil || rec.Route != tc.want {
				t.Errorf("recorded route %q (%v), want %q", rec.Route, err, tc.want)
			}
		})
	}
}

// TestHandlerErrorRenderedOnce: an error the handler returns is rendered
// by the app's HTTPErrorHandler into the capture, once; the retry replays
// those bytes without running the handler or the error handler again. A
// handler that wrote its response and then returned an error keeps its
// response: echo's Committed flag still tracks the captured writes.
func TestHandlerErrorRenderedOnce(t *testing.T) {
	eng, _ := newEngine(t)
	e := echo.New()
	var rendered, runs atomic.Int32
	e.HTTPErrorHandler = func(c *echo.Context, err error) {
		rendered.Add(1)
		echo.DefaultHTTPErrorHandler(false)(c, err)
	}
	e.Use(mw(t, eng))
	e.POST("/refused", func(*echo.Context) error {
		runs.Add(1)
		return echo.NewHTTPError(http.StatusBadRequest, "invalid amount")
	})
	e.POST("/wrote", func(c *echo.Context) error {
		runs.Add(1)
		if err := c.String(http.StatusCreated, "written"); err != nil {
			return err
		}
		return errors.New("after the response")
	})
	first := serve(e, http.MethodPost, "/refused", "k1", strings.NewReader("{}"))
	again := serve(e, http.MethodPost, "/refused", "k1", strings.NewReader("{}"))
	if first.Code != http.StatusBadRequest || !strings.Contains(first.Body.String(), "invalid amount") {
		t.Errorf("first: %d %q, want the error handler's 400", first.Code, first.Body.String())
	}
	if !replayed(again) || again.Code != first.Code || again.Body.String() != first.Body.String() {
		t.Errorf("retry: %d %q replayed=%v, want the stored 400", again.Code, again.Body.String(), replayed(again))
	}
	w := serve(e, http.MethodPost, "/wrote", "k2", strings.NewReader("{}"))
	if w.Code != http.StatusCreated || w.Body.String() != "written" {
		t.Errorf("handler that wrote then failed: %d %q, want its own 201 \"written\"", w.Code, w.Body.String())
	}
	if w := serve(e, http.MethodPost, "/wrote", "k2", strings.NewReader("{}")); !replayed(w) || w.Body.String() != "written" {
		t.Errorf("its retry: %d %q replayed=%v", w.Code, w.Body.String(), replayed(w))
	}
	if r, n := runs.Load(), rendered.Load(); r != 2 || n != 2 {
		t.Errorf("handlers ran %d times, error handler %d; want 2 and 2", r, n)
	}
}

// TestBodyLimitAnswers413: echo's BodyLimit fails a read past the limit
// with its own 413 error; idem reads the body first (for the fingerprint)
// and answers 413 body-too-large, not 400 body-unreadable.
func TestBodyLimitAnswers413(t *testing.T) {
	eng, store := newEngine(t)
	e := echo.New()
	e.Use(middleware.BodyLimit(8), mw(t, eng))
	e.POST("/upload", func(c *echo.Context) error { return c.NoContent(http.StatusCreated) })
	// No Content-Length: BodyLimit can only fail the read.
	body := io.MultiReader(strings.NewReader(`{"data":"`), strings.NewReader(strings.Repeat("x", 64)+`"}`))
	w := serve(e, http.MethodPost, "/upload", "k", body)
	if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "body-too-large") {
		t.Errorf("over the limit: %d %q, want 413 body-too-large", w.Code, w.Body.String())
	}
	if n := store.Len(); n != 0 {
		t.Errorf("%d records, want 0", n)
	}
}

// TestLeaseInHandlerContext: the handler's request context carries the
// key (and the lease); outer middleware gets its own request back.
func TestLeaseInHandlerContext(t *testing.T) {
	eng, _ := newEngine(t)
	e := echo.New()
	var inner, outer string
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			err := next(c)
			outer, _ = core.KeyFromContext(c.Request().Context())
			return err
		}
	}, mw(t, eng))
	e.POST("/v1/payments", func(c *echo.Context) error {
		inner, _ = core.KeyFromContext(c.Request().Context())
		return c.NoContent(http.StatusCreated)
	})
	if w := serve(e, http.MethodPost, "/v1/payments", "k-ctx", strings.NewReader("{}")); w.Code != http.StatusCreated {
		t.Fatalf("%d %q", w.Code, w.Body.String())
	}
	if inner != "k-ctx" || outer != "" {
		t.Errorf("key in the handler %q, in outer middleware %q; want k-ctx and none", inner, outer)
	}
}

// TestSkipperLetsRequestsThrough: a middleware.Skipper is accepted as is;
// skipped requests need no key and record nothing.
func TestSkipperLetsRequestsThrough(t *testing.T) {
	eng, store := newEngine(t)
	var skip middleware.Skipper = func(c *echo.Context) bool { return c.Request().Header.Get("X-Internal") != "" }
	e := echo.New()
	e.Use(mw(t, eng, echov5idem.WithSkipper(skip)))
	e.POST("/v1/payments", func(c *echo.Context) error { return c.NoContent(http.StatusCreated) })
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader("{}"))
	req.Header.Set("X-Internal", "1")
	w := httptest.NewRecorder()
	e.ServeHTTP(w, req)
	if w.Code != http.StatusCreated || store.Len() != 0 {
		t.Errorf("skipped request: %d, %d records; want 201 and none", w.Code, store.Len())
	}
	if w := serve(e, http.MethodPost, "/v1/payments", "", strings.NewReader("{}")); w.Code != http.StatusBadRequest {
		t.Errorf("not skipped, no key: %d, want 400", w.Code)
	}
}

// TestConcurrentDuplicatesRunOnce: concurrent requests with one key over a
// real listener run the handler exactly once; the others get the replay
// or 409 in flight, never a second execution.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	eng, _ := newEngine(t)
	e := echo.New()
	e.Use(mw(t, eng))
	var runs atomic.Int32
	release := make(chan struct{})
	e.POST("/v1/payments/:id", func(c *echo.Context) error {
		runs.Add(1)
		<-release
		return c.JSON(http.StatusCreated, map[string]string{"id": c.Param("id")})
	})
	srv := httptest.NewServer(e)
	defer srv.Close()

	const n = 16
	var wg sync.WaitGroup
	statuses := make(chan int, n)
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments/p1", strings.NewReader(`{"amount":1}`))
			req.Header.Set("Idempotency-Key", "k-race")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Errorf("request: %v", err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	// Every duplicate but the one running has been answered 409 (in
	// flight) before the handler is let go.
	conflicts := 0
	for conflicts < n-1 {
		if s := <-statuses; s != http.StatusConflict {
			t.Fatalf("duplicate answered %d while the first runs, want 409", s)
		}
		conflicts++
	}
	close(release)
	wg.Wait()
	if s := <-statuses; s != http.StatusCreated {
		t.Errorf("the running request: %d, want 201", s)
	}
	if r := runs.Load(); r != 1 {
		t.Errorf("handler ran %d times, want 1", r)
	}
}
