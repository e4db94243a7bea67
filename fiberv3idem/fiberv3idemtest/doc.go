// Package fiberv3idemtest is fiberv3idem's conformance-suite kit, for the
// adapter's own tests (the suite on memstore, in fiberv3idem) and the
// database tests (the suite on pgstore, mysqlstore and sqlitestore, in
// tests/fiberv3idem): Adapter, the idemtest.Adapter that serves
// core/idemtest's routes on a Fiber v3 app behind the idem handler, and the
// pieces both sides share with it: NewApp and Serve (an app on a real
// listener that stops cleanly when the test ends), Client and Do (one
// request, read in full), and SameResponse (a replay is the first response
// again). It is the one copy of each; both sides import it.
package fiberv3idemtest
