package ginidem_test

import (
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
)

// TestConcurrentDuplicates: 100 simultaneous duplicates run the handler
// once; the other 99 get 409 while it is in flight. The requests are served
// in-process inside a synctest bubble: synctest.Wait returns once every
// duplicate has answered and the owner is blocked in the handler, with no
// timing involved.
func TestConcurrentDuplicates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const total = 100
		var n atomic.Int64
		release := make(chan struct{})
		releaseOwner := sync.OnceFunc(func() { close(release) })
		defer releaseOwner() // on failure too: no handler is left blocked
		r := gin.New()
		r.POST("/v1/payments", mw(newEngine(t)), func(c *gin.Context) {
			i := n.Add(1)
			<-release
			c.JSON(http.StatusCreated, gin.H{"id": i})
		})
		statuses := make(chan int, total)
		for range total {
			go func() {
				res := serve(r, req{Path: "/v1/payments", Key: "dup", Body: payBody})
				if res.Status == http.StatusConflict {
					assert.NotEmpty(t, res.Header.Get("Retry-After"), "409 without Retry-After")
					assert.Contains(t, string(res.Body), problem.InFlight, "409 body is not the in-flight problem")
				}
				statuses <- res.Status
			}()
		}
		synctest.Wait() // every goroutine has answered or is blocked in the handler
		require.Len(t, statuses, total-1, "answers while the owner runs")
		got := map[int]int{}
		for range total - 1 {
			got[<-statuses]++
		}
		assert.Equal(t, map[int]int{http.StatusConflict: total - 1}, got, "answers while the owner runs")
		releaseOwner()
		assert.Equal(t, http.StatusCreated, <-statuses, "the owner's answer")
		assert.EqualValues(t, 1, n.Load(), "handler runs")
		replay := serve(r, req{Path: "/v1/payments", Key: "dup", Body: payBody})
		assert.Equal(t, http.StatusCreated, replay.Status, "after the burst: a replayed 201")
		assert.Equal(t, "true", replay.Header.Get(core.ReplayedHeader), "after the burst: a replayed 201")
	})
}
