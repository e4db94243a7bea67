// Package nethttpidem_test runs the idemtest conformance suite for
// nethttpidem on the database stores (pgstore, mysqlstore, sqlitestore),
// whose drivers the root module does not require, with the adapter of
// nethttpidem/nethttpidemtest. Every other test of the net/http adapter,
// the suite on memstore included, lives beside the code in nethttpidem.
package nethttpidem_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
