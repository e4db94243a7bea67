package echov5idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

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
	assert.Equal(t, http.StatusBadRequest, first.Code, "first: the error handler's 400")
	assert.Contains(t, first.Body.String(), "invalid amount", "first: the error handler's 400")
	assert.True(t, replayed(again), "retry: the stored 400, replayed")
	assert.Equal(t, first.Code, again.Code, "retry status")
	assert.Equal(t, first.Body.String(), again.Body.String(), "retry body")
	w := serve(e, http.MethodPost, "/wrote", "k2", strings.NewReader("{}"))
	assert.Equal(t, http.StatusCreated, w.Code, "handler that wrote then failed: its own 201")
	assert.Equal(t, "written", w.Body.String(), "handler that wrote then failed: its own body")
	w = serve(e, http.MethodPost, "/wrote", "k2", strings.NewReader("{}"))
	assert.True(t, replayed(w), "its retry: replayed (%d)", w.Code)
	assert.Equal(t, "written", w.Body.String(), "its retry")
	assert.EqualValues(t, 2, runs.Load(), "handler runs")
	assert.EqualValues(t, 2, rendered.Load(), "error handler runs")
}

// completeDownStore fails every Complete, as a database lost between the
// claim and the commit.
type completeDownStore struct{ *memstore.Store }

func (completeDownStore) Complete(context.Context, storekit.Fence, storekit.StoredResponse) error {
	return errors.New("db down at commit")
}

// TestStreamedCommitFailureCutsResponse: a flushed 201 whose outcome could
// not be recorded reaches the client broken, never complete, through
// echo's Recover too (which passes http.ErrAbortHandler on).
func TestStreamedCommitFailureCutsResponse(t *testing.T) {
	eng, err := core.New(completeDownStore{memstore.New()}, core.WithSharedKeySpace())
	require.NoError(t, err)
	e := echo.New()
	e.Use(middleware.Recover())
	e.POST("/pay", func(c *echo.Context) error {
		c.Response().WriteHeader(http.StatusCreated)
		_, _ = c.Response().Write([]byte(`{"id":"pay_1",`))
		_ = http.NewResponseController(c.Response()).Flush()
		_, _ = c.Response().Write([]byte(`"status":"charged"}`))
		return nil
	}, mw(t, eng))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k")
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return // cut before the header
	}
	b, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	require.Error(t, err, "client got a complete %d %q for an outcome that was not recorded; want a broken response", res.StatusCode, b)
}
