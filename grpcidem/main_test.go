package grpcidem_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// server, a client connection or a call the interceptors did not end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
