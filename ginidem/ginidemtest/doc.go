// Package ginidemtest is ginidem's conformance-suite kit: Adapter, the
// idemtest.Adapter that serves core/idemtest's routes on a gin engine
// behind the middleware, for the adapter's own tests (the suite on
// memstore, in ginidem) and the database tests (the suite on pgstore,
// mysqlstore and sqlitestore, in tests/ginidem). It is the one copy of
// that adapter; both sides import it.
package ginidemtest
