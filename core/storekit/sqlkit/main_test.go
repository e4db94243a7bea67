package sqlkit

import (
	"testing"

	"go.uber.org/goleak"
)

// The lease state tests open a database/sql pool: its goroutines must end
// with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
