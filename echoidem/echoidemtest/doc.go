// Package echoidemtest is echoidem's conformance-suite kit: Adapter, the
// idemtest.Adapter that serves core/idemtest's routes on an Echo app
// behind the middleware, for the adapter's own tests (the suite on
// memstore, in echoidem) and the database tests (the suite on pgstore,
// mysqlstore and sqlitestore, in tests/echoidem). It is the one copy of
// that adapter; both sides import it.
package echoidemtest
