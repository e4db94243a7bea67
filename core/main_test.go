package core_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Proceed decision starts a heartbeat goroutine that Commit or Abort
// must stop: a leak here is a bug in the engine's lifetime handling.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
