package echoidem_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// TestContextBodyAndEchoState: the handler gets the key in its request
// context, the body idem read, its route parameters and the headers outer
// middleware set; outer middleware sees echo's response state as usual
// (status, size, committed), on the first response and on the replay, and a
// request context that is not the finished lease's. The record holds the
// canonical route template.
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
	outerSaw := func() seen {
		mu.Lock()
		defer mu.Unlock()
		return outer
	}
	s.E.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Header().Set(echo.HeaderXRequestID, "rid-1")
			err := next(c)
			mu.Lock()
			defer mu.Unlock()
			_, lease := storekit.LeaseFromContext(c.Request().Context())
			outer = seen{c.Response().Status, c.Response().Size, c.Response().Committed, c.Request().Context().Err(), lease}
			return err
		}
	})
	s.E.POST("/items/:id", func(c echo.Context) error {
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
	}, mw(s.Eng))
	s.E.POST("/empty", func(echo.Context) error { return nil }, mw(s.Eng))
	s.Start()

	r := s.Do("POST", "/items/42", "the-key", `{"a":1}`)
	require.Equal(t, http.StatusCreated, r.Status, "handler saw: %v", r)
	require.Equal(t, `the-key|42|{"a":1}|rid-1`, string(r.Body), "handler saw")
	assert.Equal(t, "rid-1", r.Header.Get(echo.HeaderXRequestID), "outer header")
	want := seen{status: 201, size: int64(len(r.Body)), committed: true}
	assert.Equal(t, want, outerSaw(), "outer middleware after first")
	rec, err := s.Store.Get(context.Background(), "", "the-key")
	if assert.NoError(t, err) {
		assert.Equal(t, "/items/{id}", rec.Route, "stored route: the canonical template")
	}
	// Replay through echo's writer: outer middleware sees it as usual.
	replay := s.Do("POST", "/items/42", "the-key", `{"a":1}`)
	sameAsFirst(t, r, replay)
	assert.Equal(t, "rid-1", replay.Header.Get(echo.HeaderXRequestID), "replay lost the outer header")
	assert.Equal(t, want, outerSaw(), "outer middleware after replay")

	// A handler that writes nothing: idem sends the empty 200 itself, and
	// echo must know the response is committed (or an outer middleware or
	// the error handler would write a second one).
	r = s.Do("POST", "/empty", "empty-key", "")
	assert.Equal(t, http.StatusOK, r.Status, "empty: client %v", r)
	assert.Empty(t, r.Body, "empty: client %v", r)
	assert.Equal(t, seen{status: 200, committed: true}, outerSaw(), "empty: outer middleware")
}
