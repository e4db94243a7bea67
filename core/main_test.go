package core_test

import (
	"testing"

	"github.com/idemkit/idem/internal/testkit/leak"
)

// Every Proceed decision starts a heartbeat goroutine that Commit or Abort
// must stop: a leak here is a bug in the engine's lifetime handling.
func TestMain(m *testing.M) { leak.VerifyTestMain(m) }
