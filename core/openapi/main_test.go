package openapi_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The key pattern test runs the engine: every Proceed decision it gets is
// aborted, which stops its heartbeat goroutine.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
