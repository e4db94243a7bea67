package echoidem_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
)

// TestNativeResponsesReplayIdentically: echo's own response helpers (and a
// returned *echo.HTTPError, and nothing written) are replayed byte for byte,
// allow-listed headers only, no Set-Cookie; the handler runs once, and the
// same key with another body is refused.
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
			s.E.POST("/v1/payments", func(c echo.Context) error {
				runs.Add(1)
				return tc.handler(c)
			}, mw(s.Eng))
			s.Start()

			first := s.Do("POST", "/v1/payments", "key-1", `{"amount":1000}`)
			require.Equal(t, tc.status, first.Status, "first: %v", first)
			if tc.name == "JSON" || tc.name == "String" {
				c := first.Header.Get("Set-Cookie")
				assert.True(t, strings.HasPrefix(c, "session=s3cr3t"), "first response Set-Cookie %q", c)
			}
			replay := s.Do("POST", "/v1/payments", "key-1", `{"amount":1000}`)
			sameAsFirst(t, first, replay)
			if tc.name == "JSON" {
				assert.Empty(t, replay.Header.Get("X-Not-Allowed"), "non-allow-listed header replayed")
				assert.Equal(t, "/v1/payments/p_1", replay.Header.Get("Location"), "replay Location")
			}
			assert.EqualValues(t, 1, runs.Load(), "handler runs")
			// A different body under the same key is refused.
			mismatch := s.Do("POST", "/v1/payments", "key-1", `{"amount":50000}`)
			if assert.Equal(t, http.StatusUnprocessableEntity, mismatch.Status, "mismatch: %v", mismatch) {
				assert.Equal(t, problem.PayloadMismatch, problemType(t, mismatch), "mismatch")
			}
		})
	}
}

// TestHTTPErrorStoredAsClientSawIt: a returned *echo.HTTPError is rendered
// once, into the capture, and stored as the client saw it, under the
// canonical route.
func TestHTTPErrorStoredAsClientSawIt(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	s.E.POST("/v1/payments", func(echo.Context) error {
		runs.Add(1)
		return echo.NewHTTPError(http.StatusBadRequest, "bad")
	}, mw(s.Eng, tenantScope()))
	s.Start()

	first := s.Do("POST", "/v1/payments", "k", `{}`, "X-Tenant", "acme")
	require.Equal(t, http.StatusBadRequest, first.Status, "first: %v", first)
	require.Equal(t, `{"message":"bad"}`, strings.TrimSpace(string(first.Body)), "first")
	rec, err := s.Store.Get(context.Background(), "acme", "k")
	require.NoError(t, err)
	require.Equal(t, storekit.StatusCompleted, rec.Status, "record status")
	require.NotNil(t, rec.Response, "stored response")
	require.Equal(t, http.StatusBadRequest, rec.Response.Status, "stored status")
	require.Equal(t, string(first.Body), string(rec.Response.Body), "stored body, as the client saw it")
	assert.Equal(t, "/v1/payments", rec.Route, "stored route")
	sameAsFirst(t, first, s.Do("POST", "/v1/payments", "k", `{}`, "X-Tenant", "acme"))
	assert.EqualValues(t, 1, runs.Load(), "handler runs")
}

// TestCustomHTTPErrorHandlerIsUsed: the app's HTTPErrorHandler renders a
// returned error, and what it wrote is what is replayed.
func TestCustomHTTPErrorHandlerIsUsed(t *testing.T) {
	s := newServer(t, nil)
	s.E.HTTPErrorHandler = func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		_ = c.String(http.StatusTeapot, "custom: "+err.Error())
	}
	var runs atomic.Int32
	s.E.POST("/x", func(echo.Context) error {
		runs.Add(1)
		return errors.New("boom")
	}, mw(s.Eng))
	s.Start()
	first := s.Do("POST", "/x", "k", "")
	require.Equal(t, http.StatusTeapot, first.Status, "first: %v", first)
	require.Equal(t, "custom: boom", string(first.Body), "first")
	sameAsFirst(t, first, s.Do("POST", "/x", "k", ""))
	assert.EqualValues(t, 1, runs.Load(), "handler runs")
}

// TestStreamedResponseIsNotRetained: a flushed response goes out as
// written; a retry gets the not-retained problem, not a second run.
func TestStreamedResponseIsNotRetained(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	s.E.POST("/stream", func(c echo.Context) error {
		runs.Add(1)
		c.Response().Header().Set("Content-Type", "text/plain")
		c.Response().WriteHeader(http.StatusOK)
		for i := range 3 {
			_, _ = fmt.Fprintf(c.Response(), "chunk %d\n", i)
			c.Response().Flush()
		}
		return nil
	}, mw(s.Eng))
	s.Start()
	first := s.Do("POST", "/stream", "k", "")
	require.Equal(t, http.StatusOK, first.Status, "first: %v", first)
	require.Equal(t, "chunk 0\nchunk 1\nchunk 2\n", string(first.Body), "first")
	again := s.Do("POST", "/stream", "k", "")
	if assert.Equal(t, http.StatusConflict, again.Status, "retry: %v", again) {
		assert.Equal(t, problem.NotRetained, problemType(t, again), "retry")
	}
	assert.EqualValues(t, 1, runs.Load(), "handler runs")
}

// TestResponseBeforeHooks: hooks registered with c.Response().Before by
// outer middleware run once per response actually sent: during capture
// (their headers go out with the handler's response) and again for a replay
// written through echo's writer.
func TestResponseBeforeHooks(t *testing.T) {
	s := newServer(t, nil)
	var hooks atomic.Int32
	s.E.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Before(func() {
				hooks.Add(1)
				c.Response().Header().Set("X-Served-By", "hook")
			})
			return next(c)
		}
	})
	s.E.POST("/x", func(c echo.Context) error { return c.String(http.StatusCreated, "ok") }, mw(s.Eng))
	s.Start()
	first := s.Do("POST", "/x", "k", "")
	require.Equal(t, http.StatusCreated, first.Status, "first: %v", first)
	require.Equal(t, "hook", first.Header.Get("X-Served-By"), "first: %v", first)
	require.EqualValues(t, 1, hooks.Load(), "hooks run after the first response")
	replay := s.Do("POST", "/x", "k", "")
	sameAsFirst(t, first, replay)
	assert.Equal(t, "hook", replay.Header.Get("X-Served-By"), "replay: %v", replay)
	assert.EqualValues(t, 2, hooks.Load(), "hooks run after the replay")
}
