// Package storekit is for store authors: the records, fences and requests
// a core.Store is called with, the optional capabilities a store may add
// (Watcher, StepStore, ClaimSyncer, Admin), the errors stores return, and
// helpers they share (As, ReleaseRefused, ClaimMix). Service authors do
// not need it: they pass a ready store (core/memstore, pgstore,
// mysqlstore) to core.New.
//
// core.Store is this package's Store (a type alias). storekit imports only
// the standard library, never core; core/storetest is the conformance
// suite every store must pass.
package storekit
