// Package storetest is the conformance suite every core.Store must pass.
//
// A store author calls Run from a test and, optionally, Benchmark from a
// benchmark, each with a constructor that returns a fresh, empty store:
//
//	func newStore(tb testing.TB) core.Store {
//		s := mystore.New(...)          // e.g. a fresh schema or database
//		tb.Cleanup(func() { s.Close() })
//		return s
//	}
//
//	func TestConformance(t *testing.T)    { storetest.Run(t, newStore) }
//	func BenchmarkConformance(b *testing.B) { storetest.Benchmark(b, newStore) }
//
// The constructor takes a testing.TB so that one function serves both Run
// (which passes a *testing.T) and Benchmark (a *testing.B). It is called
// once per sub-test; it should fail tb (tb.Fatal, or tb.Skip when the
// backing service is unavailable) rather than return nil. Stores need not
// be empty in practice: every sub-test uses unique scopes and keys, but
// isolating each call (pgstore uses a fresh schema) keeps failures local.
//
// What the suite can and cannot check: stores read time from their own
// clock (pgstore uses the database's now()), so the suite cannot inject
// time. Lease lapses and retention expiry are exercised with short leases
// (50–100ms) and short sleeps, and instants are compared against
// storekit.ClaimResult.Now, never against the test's clock. A few sub-tests
// therefore take a fraction of a second each.
//
// Behaviour pinned down beyond the core.Store doc comments:
//   - Fence writes (Heartbeat, Complete, Fail) on a record that does not
//     exist, is not processing, or carries another token return
//     core.ErrLeaseLost and change nothing.
//   - A nil and an empty response body both read back as an empty body
//     (len 0); which of the two a store returns is not specified. Likewise
//     a nil and an empty header map.
//   - Tokens handed out by consecutive claims are strictly increasing, not
//     only per key.
//   - A takeover computes LockedUntil and ExpiresAt afresh from its own
//     request and the store's now, as an insert does.
//   - The empty scope is a scope like any other (the engine uses it when
//     no tenant is configured).
//   - A processing record whose lease lapsed but which nobody took over is
//     still owned by its token: its owner may heartbeat and complete it.
//   - Get of an expired record is not checked: a store may return it or
//     report storekit.ErrNotFound.
//   - CreatedAt names the record's incarnation (core.RelayKey derives
//     from it): the claim that creates a record, every takeover of it, its
//     replays and Get return the very same instant (compared with Equal,
//     so a store returns what it keeps, e.g. microseconds); a record
//     created again after expiry, or after Sweep (storekit.Admin) or Purge
//     deleted it, gets a new, later one. Group "RelayKey" checks the
//     consequence through the engine: one relay key for every attempt at
//     a record (after a failure, after its owner died), another for a new
//     record under the same key and body. The after-sweep case skips only
//     when the store has neither Sweep nor Purge; a store whose sweep keeps
//     expired records for a retention margin fails it unless it is run
//     with that margin at zero (as pgstore, mysqlstore and sqlitestore run
//     the suite: WithRetentionMargin(0)).
//
// A store that also implements the optional storekit.Watcher is checked to wake
// a watch on each change a waiting duplicate acts on (claim, Fail, takeover,
// Complete) within a few seconds; those sub-tests skip for other stores.
//
// A store that also implements the optional storekit.StepStore (recovery
// points, core.Step) is checked in the "Steps" group: save and load, fenced
// writes (a stale owner's write is refused and changes nothing, also when
// every past owner of a key writes at once, and while a takeover races the
// old owner's writes), steps survive a takeover, end with completion,
// expire with their record (a key new again has none), scope isolation, the
// size limits and done contexts. Those sub-tests skip for other stores,
// except Steps/TakeoverNotFresh, which every store must pass: a takeover
// never reports storekit.ClaimResult.Fresh.
//
// Stores that hand the handler a database transaction (Tx) and queue writes
// with the response (Defer) also pass the sibling package
// core/storetest/txtest, the contract of transactional SQL stores.
//
// BenchmarkWaitWake is a single benchmark body rather than a suite: it
// measures how soon a waiting duplicate (core.WithWait) replays after the
// owner commits, on a given store, polled or woken by its storekit.Watcher.
package storetest
