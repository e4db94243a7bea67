package fiberidem_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp refreshes its cached Date header once a second from a
		// goroutine it starts, once per process, with the first server.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// Only the benchmarks build fiber's own idempotency middleware,
		// whose default in-memory storage starts a garbage collector and
		// fiber's timestamp updater that cannot be stopped.
		goleak.IgnoreAnyFunction("github.com/gofiber/fiber/v2/internal/storage/memory.(*Storage).gc"),
		goleak.IgnoreAnyFunction("github.com/gofiber/fiber/v2/utils.StartTimeStampUpdater.func1.1"),
	)
}
