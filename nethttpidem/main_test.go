package nethttpidem_test

import (
	"testing"

	"github.com/idemkit/idem/internal/testkit/leak"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m)
}
