// Package ginidemtest is ginidem's conformance-suite kit, for the
// adapter's own tests (the suite on memstore, in ginidem) and the database
// tests (the suite on pgstore, mysqlstore and sqlitestore, in
// tests/ginidem): Adapter, the idemtest.Adapter that serves
// core/idemtest's routes on a gin engine behind the middleware, and the
// pieces both sides' tests share: Do (a Request served in process, its
// Response read in full) and SameResponse (a replay is the first response
// again). It is the one copy of each; both sides import it.
package ginidemtest
