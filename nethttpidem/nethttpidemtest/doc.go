// Package nethttpidemtest is nethttpidem's conformance-suite kit: Adapter,
// the idemtest.Adapter that serves core/idemtest's routes through the
// net/http middleware, for the adapter's own tests (the suite on memstore,
// in nethttpidem) and the database tests (the suite on pgstore, mysqlstore
// and sqlitestore, in tests/nethttpidem). It is the one copy of that
// adapter; both sides import it.
//
// Like core/idemtest it is library code: standard library only.
package nethttpidemtest
