package ginidem_test

import (
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/ginidem"
)

// TestScopeSeparatesUsers: the scope comes from an auth middleware's
// context value; the same key from two users runs twice; no user answers
// 401.
func TestScopeSeparatesUsers(t *testing.T) {
	var n atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) { // demo auth
		if u := c.GetHeader("X-User-ID"); u != "" {
			c.Set("user", u)
		}
	})
	mw := mw(newEngine(t), ginidem.WithScope(func(c *gin.Context) (string, error) {
		u := c.GetString("user")
		if u == "" {
			return "", errors.New("unauthenticated")
		}
		return u, nil
	}))
	r.POST("/v1/payments", mw, func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"id": n.Add(1), "user": c.GetString("user")})
	})
	alice := serve(r, req{Path: "/v1/payments", Key: "same", Body: payBody, Header: map[string]string{"X-User-ID": "alice"}})
	bob := serve(r, req{Path: "/v1/payments", Key: "same", Body: payBody, Header: map[string]string{"X-User-ID": "bob"}})
	assert.Equal(t, http.StatusCreated, alice.Status, "alice")
	assert.Equal(t, http.StatusCreated, bob.Status, "bob")
	assert.EqualValues(t, 2, n.Load(), "handler runs: one per user")
	checkReplay(t, alice, serve(r, req{Path: "/v1/payments", Key: "same", Body: payBody, Header: map[string]string{"X-User-ID": "alice"}}))
	checkProblem(t, serve(r, req{Path: "/v1/payments", Key: "same", Body: payBody}), http.StatusUnauthorized, problem.ScopeUnavailable)
	assert.EqualValues(t, 2, n.Load(), "handler ran without a scope")
}

// TestSkipLetsRequestsThrough: skipped requests go through untouched (no
// key required).
func TestSkipLetsRequestsThrough(t *testing.T) {
	r := gin.New()
	mw := mw(newEngine(t), ginidem.WithSkip(func(c *gin.Context) bool {
		return c.GetHeader("X-Internal") == "1"
	}))
	r.POST("/v1/payments", mw, func(c *gin.Context) { c.Status(http.StatusCreated) })
	got := serve(r, req{Path: "/v1/payments", Body: payBody, Header: map[string]string{"X-Internal": "1"}})
	assert.Equal(t, http.StatusCreated, got.Status, "skipped request; body %q", got.Body)
	checkProblem(t, serve(r, req{Path: "/v1/payments", Body: payBody}), http.StatusBadRequest, problem.MissingKey)
}

// TestNilOptionsAndEngine: nil options are ignored; New with a nil engine
// fails instead of building a middleware that would panic.
func TestNilOptionsAndEngine(t *testing.T) {
	r := gin.New()
	r.POST("/ok", mw(newEngine(t), nil, ginidem.WithScope(nil), ginidem.WithSkip(nil), ginidem.WithErrorHandler(nil)),
		func(c *gin.Context) { c.Status(http.StatusCreated) })
	first := serve(r, req{Path: "/ok", Key: "n", Body: payBody})
	assert.Equal(t, http.StatusCreated, first.Status, "with nil options; body %q", first.Body)
	checkReplay(t, first, serve(r, req{Path: "/ok", Key: "n", Body: payBody}))
	m, err := ginidem.New(nil, ginidem.WithScope(func(*gin.Context) (string, error) { return "u", nil }))
	assert.Error(t, err, "New(nil)")
	assert.Nil(t, m, "New(nil)")
}
