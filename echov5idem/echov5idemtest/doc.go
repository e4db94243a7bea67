// Package echov5idemtest is echov5idem's conformance-suite kit: Adapter,
// the idemtest.Adapter that serves core/idemtest's routes on an Echo v5
// app behind the middleware, for the adapter's own tests (the suite on
// memstore, in echov5idem) and the database tests (the suite on pgstore,
// mysqlstore and sqlitestore, in tests/echov5idem). It is the one copy of
// that adapter; both sides import it.
package echov5idemtest
