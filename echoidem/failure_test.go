package echoidem_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// TestPlainErrorIsRetryable: a plain error returned by the handler is
// rendered by echo (500) and not stored; the retry runs again and its
// answer is what is replayed.
func TestPlainErrorIsRetryable(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	s.E.POST("/v1/payments", func(c echo.Context) error {
		if runs.Add(1) == 1 {
			return errors.New("x")
		}
		return c.JSON(http.StatusCreated, map[string]string{"id": "p_1"})
	}, mw(s.Eng))
	s.Start()

	first := s.Do("POST", "/v1/payments", "k", `{"amount":1}`)
	require.Equal(t, http.StatusInternalServerError, first.Status, "first: %v", first)
	require.False(t, first.Replayed(), "first: %v", first)
	assert.Contains(t, string(first.Body), "Internal Server Error", "first body is echo's 500")
	second := s.Do("POST", "/v1/payments", "k", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, second.Status, "retry: %v", second)
	require.False(t, second.Replayed(), "retry: %v", second)
	assert.EqualValues(t, 2, runs.Load(), "handler runs")
	sameAsFirst(t, second, s.Do("POST", "/v1/payments", "k", `{"amount":1}`))
}

// TestPanicAnswers500AndKeyIsRetryable: a panic before anything went out is
// answered with the 500 problem (the outer recover never sees it, outer
// middleware sees the 500) and the key is released.
func TestPanicAnswers500AndKeyIsRetryable(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	var outerSawPanic atomic.Bool
	var outerStatus atomic.Int32
	// An outer recover, as echo's middleware.Recover would sit.
	s.E.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
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
	s.E.POST("/v1/payments", func(c echo.Context) error {
		if runs.Add(1) == 1 {
			_ = c.JSON(http.StatusCreated, map[string]string{"half": "written"})
			panic("boom")
		}
		return c.JSON(http.StatusCreated, map[string]string{"id": "p_1"})
	}, mw(s.Eng))
	s.Start()

	first := s.Do("POST", "/v1/payments", "k", `{}`)
	require.Equal(t, http.StatusInternalServerError, first.Status, "first: %v", first)
	require.Equal(t, problem.HandlerPanic, problemType(t, first), "first: %v", first)
	assert.False(t, outerSawPanic.Load(), "panic propagated to the outer middleware")
	assert.EqualValues(t, http.StatusInternalServerError, outerStatus.Load(), "status the outer middleware saw")
	second := s.Do("POST", "/v1/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, second.Status, "retry: %v", second)
	require.False(t, second.Replayed(), "retry: %v", second)
	require.EqualValues(t, 2, runs.Load(), "handler runs")
}

// TestPanicAfterStreamingDropsConnection: once part of the response went
// out, the panic is re-raised as http.ErrAbortHandler (the client gets a
// broken response) and the key is released.
func TestPanicAfterStreamingDropsConnection(t *testing.T) {
	s := newServer(t, nil)
	var outerSaw atomic.Value
	s.E.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
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
	s.E.POST("/stream", func(c echo.Context) error {
		c.Response().WriteHeader(http.StatusOK)
		_, _ = c.Response().Write([]byte("part one"))
		c.Response().Flush()
		panic("mid-stream")
	}, mw(s.Eng))
	s.Start()

	_, err := s.Send("POST", "/stream", "k", "")
	assert.Error(t, err, "a response cut by a panic arrived whole")
	got, _ := outerSaw.Load().(string)
	assert.Equal(t, http.ErrAbortHandler.Error(), got, "panic the outer middleware saw")
	// The key was released: the record is failed, a retry may run again.
	rec, err := s.Store.Get(context.Background(), "", "k")
	if assert.NoError(t, err) {
		assert.Equal(t, storekit.StatusFailed, rec.Status, "record %+v", rec)
	}
}

// TestStreamedCommitFailureCutsResponse: a flushed 201 whose outcome could
// not be recorded reaches the client broken, never complete, through
// echo's Recover too (which passes http.ErrAbortHandler on).
func TestStreamedCommitFailureCutsResponse(t *testing.T) {
	s := newServer(t, failStore{Store: memstore.New(), finish: true})
	s.E.Use(middleware.Recover())
	s.E.POST("/pay", func(c echo.Context) error {
		c.Response().WriteHeader(http.StatusCreated)
		_, _ = c.Response().Write([]byte(`{"id":"pay_1",`))
		c.Response().Flush()
		_, _ = c.Response().Write([]byte(`"status":"charged"}`))
		return nil
	}, mw(s.Eng))
	s.Start()
	r, err := s.Send("POST", "/pay", "k", `{"amount":1}`)
	require.Error(t, err, "client got a complete %v for an outcome that was not recorded; want a broken response", r)
}
