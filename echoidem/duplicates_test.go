package echoidem_test

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrentDuplicatesRunOnce: 100 simultaneous duplicates over a real
// listener run the handler once; the other 99 are answered 409 (with
// Retry-After) while the owner is still blocked in the handler, which is
// let go only once they have all answered.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	s := newServer(t, nil)
	var runs atomic.Int32
	release := make(chan struct{})
	s.E.POST("/v1/payments", func(c echo.Context) error {
		runs.Add(1)
		<-release
		return c.JSON(http.StatusCreated, map[string]string{"id": "p_1"})
	}, mw(s.Eng))
	s.Start()
	releaseOwner := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOwner) // before the server closes, on failure too

	const n = 100
	results := make(chan *result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			r, err := s.Send("POST", "/v1/payments", "dup", `{"amount":1000}`)
			if !assert.NoError(t, err, "request") {
				r = &result{Status: -1}
			}
			results <- r
		})
	}
	close(start)
	// The timeout only turns a hang (a duplicate that never answers) into
	// a failure; the answers themselves are the signal.
	deadline := time.After(15 * time.Second)
	var created, conflict, other int
	for i := range n {
		if i == n-1 {
			// Every duplicate has been answered while the owner is blocked.
			releaseOwner()
		}
		var r *result
		select {
		case r = <-results:
		case <-deadline:
			require.FailNow(t, "timed out", "after %d responses", i)
		}
		switch r.Status {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
			conflict++
			assert.NotEmpty(t, r.Header.Get("Retry-After"), "409 without Retry-After")
		default:
			other++
			assert.Fail(t, "unexpected response", "%v", r)
		}
	}
	wg.Wait()
	assert.EqualValues(t, 1, runs.Load(), "handler runs")
	assert.Equal(t, 1, created, "201s")
	assert.Equal(t, n-1, conflict, "409s")
	assert.Zero(t, other, "other answers")
}
