// Package memstore is an in-process core.Store: a mutex-protected map of
// records keyed by (scope, key).
//
// It is meant for tests, single-process services and demos. It gives every
// guarantee of the core.Store contract within one process — atomic claims,
// strictly increasing lease tokens that are never reused, fenced writes —
// but records live only as long as the process, so it cannot coordinate
// several instances of a service or survive a restart. Use pgstore for
// that.
//
// Time comes from WithClock (default time.Now), so tests can drive lease
// lapses and expiry without sleeping. Records past their ExpiresAt that
// are not held by a live lease are treated as absent by every method and
// removed when accessed; Purge removes the rest.
//
// # Bounded by default
//
// A store holds at most DefaultMaxEntries (100 000) records, so that
// clients choosing new keys cannot grow it without limit; WithMaxEntries
// changes the bound (zero or less: unbounded). When it is full, expired
// records are reclaimed first; if none has expired, a claim that needs a
// new record fails with ErrFull, which the engine answers 503
// store-unavailable without running the handler. No record is evicted
// before it expires, live or completed: that would let a retry run the
// handler a second time. Keys already held keep their answers (replay,
// 409, takeover of a failed record) whether or not the store is full.
//
// It implements storekit.Watcher and storekit.StepStore: a record's steps live on
// the record, survive a takeover, and go when it completes or expires.
//
// Responses are copied on the way in (Complete): a caller may reuse the
// body and header map it passes. On the way out they are shared: every
// Claim and Get of a record hands out the same read-only response (its
// header map, values and body), as core.Store allows; callers copy what
// they change (the engine builds each replay's headers anew).
package memstore
