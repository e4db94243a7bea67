// Package echoidemtest is echoidem's conformance-suite kit, for the
// adapter's own tests (the suite on memstore, in echoidem) and the
// database tests (the suite on pgstore, mysqlstore and sqlitestore, in
// tests/echoidem): Adapter, the idemtest.Adapter that serves
// core/idemtest's routes on an Echo app behind the middleware, and the
// pieces both sides' tests share: Server (an Echo app and its engine on a
// real listener, with Send and Do for one request read in full into a
// Result) and SameResponse (a replay is the first response again). It is
// the one copy of each; both sides import it.
package echoidemtest
