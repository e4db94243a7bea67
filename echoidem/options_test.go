package echoidem_test

import (
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/echoidem"
)

// TestSkipLetsRequestsThrough: skipped requests need no key and a key
// does not deduplicate them; requests not skipped require the key.
func TestSkipLetsRequestsThrough(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	s.E.POST("/webhook", func(c echo.Context) error {
		runs.Add(1)
		return c.String(http.StatusOK, "ok")
	}, mw(s.Eng, echoidem.WithSkip(func(c echo.Context) bool {
		return c.Request().Header.Get("X-Internal") == "1"
	})))
	s.Start()

	// Skipped: no key needed, and a key does not deduplicate.
	for range 2 {
		r := s.Do("POST", "/webhook", "", "", "X-Internal", "1")
		require.Equal(t, http.StatusOK, r.Status, "skipped request: %v", r)
		r = s.Do("POST", "/webhook", "same", "", "X-Internal", "1")
		require.Equal(t, http.StatusOK, r.Status, "skipped request with key: %v", r)
		require.False(t, r.Replayed(), "skipped request with key: %v", r)
	}
	assert.EqualValues(t, 4, runs.Load(), "skipped handler runs")
	// Not skipped: the key is required.
	r := s.Do("POST", "/webhook", "", "")
	if assert.Equal(t, http.StatusBadRequest, r.Status, "unskipped request without key: %v", r) {
		assert.Equal(t, problem.MissingKey, problemType(t, r), "unskipped request without key")
	}
}

// TestScopeSeparatesTenants: the scope comes from an auth middleware's
// context value; the same key from two users runs twice; no user answers
// 401; a bypassed GET never calls the scope function.
func TestScopeSeparatesTenants(t *testing.T) {
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
	mw := mw(s.Eng, echoidem.WithScope(func(c echo.Context) (string, error) {
		scopeCalls.Add(1)
		u, ok := c.Get("user").(string)
		if !ok {
			return "", errors.New("no user")
		}
		return u, nil
	}))
	s.E.POST("/pay", func(c echo.Context) error {
		runs.Add(1)
		return c.String(http.StatusCreated, c.Get("user").(string))
	}, auth, mw)
	s.E.GET("/pay", func(c echo.Context) error { return c.String(200, "list") }, auth, mw)
	s.Start()

	a := s.Do("POST", "/pay", "k", "", "X-User-ID", "alice")
	b := s.Do("POST", "/pay", "k", "", "X-User-ID", "bob")
	require.Equal(t, http.StatusCreated, a.Status, "alice %v", a)
	require.Equal(t, http.StatusCreated, b.Status, "bob %v", b)
	require.Equal(t, "alice", string(a.Body), "alice")
	require.Equal(t, "bob", string(b.Body), "bob")
	require.False(t, b.Replayed(), "bob got alice's replay: %v", b)
	assert.EqualValues(t, 2, runs.Load(), "handler runs: one per tenant")
	anon := s.Do("POST", "/pay", "k", "")
	if assert.Equal(t, http.StatusUnauthorized, anon.Status, "no user: %v", anon) {
		assert.Equal(t, problem.ScopeUnavailable, problemType(t, anon), "no user")
	}
	calls := scopeCalls.Load()
	r := s.Do("GET", "/pay", "", "")
	assert.Equal(t, http.StatusOK, r.Status, "GET: %v", r)
	assert.Equal(t, calls, scopeCalls.Load(), "scope function called for a bypassed GET")
}

// TestNilEngineAndNilOptions: nil options are ignored; New with a nil
// engine fails instead of building a middleware that would panic.
func TestNilEngineAndNilOptions(t *testing.T) {
	s := newServer(t, nil)
	s.E.POST("/opts", func(c echo.Context) error { return c.String(200, "ran") },
		mw(s.Eng, nil, echoidem.WithScope(nil), echoidem.WithSkip(nil), echoidem.WithErrorHandler(nil)))
	s.Start()
	m, err := echoidem.New(nil, echoidem.WithScope(func(echo.Context) (string, error) { return "u", nil }))
	assert.Error(t, err, "New(nil)")
	assert.Nil(t, m, "New(nil)")
	first := s.Do("POST", "/opts", "k", "")
	require.Equal(t, http.StatusOK, first.Status, "nil options: %v", first)
	sameAsFirst(t, first, s.Do("POST", "/opts", "k", ""))
}
