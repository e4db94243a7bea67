package echov5idem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrentDuplicatesRunOnce: concurrent requests with one key over a
// real listener run the handler exactly once; the others get 409 in
// flight, never a second execution. The owner is let go only once every
// duplicate has answered.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	eng, _ := newEngine(t)
	e := echo.New()
	e.Use(mw(t, eng))
	var runs atomic.Int32
	release := make(chan struct{})
	releaseOwner := sync.OnceFunc(func() { close(release) })
	e.POST("/v1/payments/:id", func(c *echo.Context) error {
		runs.Add(1)
		<-release
		return c.JSON(http.StatusCreated, map[string]string{"id": c.Param("id")})
	})
	srv := httptest.NewServer(e)
	defer srv.Close()
	defer releaseOwner() // before the server closes, on failure too

	const n = 16
	var wg sync.WaitGroup
	statuses := make(chan int, n)
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments/p1", strings.NewReader(`{"amount":1}`))
			req.Header.Set("Idempotency-Key", "k-race")
			resp, err := srv.Client().Do(req)
			if !assert.NoError(t, err, "request") {
				statuses <- -1
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	// Every duplicate but the one running has been answered 409 (in
	// flight) before the handler is let go.
	for range n - 1 {
		require.Equal(t, http.StatusConflict, <-statuses, "a duplicate's answer while the first runs")
	}
	releaseOwner()
	wg.Wait()
	assert.Equal(t, http.StatusCreated, <-statuses, "the running request")
	assert.EqualValues(t, 1, runs.Load(), "handler runs")
}
