// Package fiberidemtest is fiberidem's conformance-suite kit, for the
// adapter's own tests (the suite on memstore, in fiberidem) and the
// database tests (the suite on pgstore, mysqlstore and sqlitestore, in
// tests/fiberidem): Adapter, the idemtest.Adapter that serves
// core/idemtest's routes on a Fiber app behind the idem handler, and the
// pieces both sides share with it: NewApp and Serve (an app on a real
// listener that stops cleanly when the test ends), Client and Do (one
// request, read in full), and SameResponse (a replay is the first response
// again). It is the one copy of each; both sides import it.
package fiberidemtest
