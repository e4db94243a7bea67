// Package txtest is the contract of transactional SQL stores: what every
// store that hands the handler a database transaction (pgstore.Tx,
// mysqlstore.Tx, sqlitestore.Tx) and queues writes to commit with the
// response (Defer) must do, written once and run against each of them.
// storetest.Run is the contract of every core.Store; this is the part only
// stores with a transactional mode share.
//
// A store's test gives Run a Harness: how to open a fresh store with an
// empty business table (Env), its Tx (as the small Tx interface; SQLTx
// adapts a *sql.Tx) and Defer, its errors, and the few behaviours in which
// the stores genuinely differ, stated as fields rather than left out:
// pgstore refuses the handler's Commit and Rollback (TxOwned) and any
// statement after the handler ended the transaction with SQL
// (RefusesAfterSQLEnd); mysqlstore completes the record as not retained
// after a ROLLBACK sent as SQL, since later statements autocommit unseen
// (SQLRollbackErr); mysqlstore and sqlitestore write a commit mark (Marks)
// that tells a takeover the handler had committed; in both a takeover waits
// for the lapsed owner's open transaction (TakeoverWaitsForTx).
//
//	func TestTxContract(t *testing.T) { txtest.Run(t, harness) }
//
// The groups:
//
//   - Tx: the handler's writes commit with the stored response and only
//     then; Fail rolls them back; a stale owner's vanish; Tx through a
//     store decorator, without a lease, after the lease ended; a heartbeat
//     and the request's end while the transaction is open; savepoints.
//   - Ends: the handler ends the transaction itself, through the object
//     (where the store allows it) and with SQL (COMMIT, ROLLBACK and what
//     Harness adds), then completes, fails, has deferred statements (one
//     refused), writes again, or its process dies; for stores with commit
//     marks, the write that would end the record fails. Whatever happens,
//     writes that landed are never run again and a response is recorded
//     only for writes that landed.
//   - Defer: deferred statements run at Complete in order, in one
//     transaction with the response (and the handler's), never on Fail,
//     not for a stale owner; a refused one rolls everything back and
//     releases the key (storekit.ErrNotCommitted); through Engine.Call.
//   - QueryCounts (with Harness.Counted): the statements or round trips
//     each phase costs, as the harness states them (see Harness.Counts).
//
// RunSentinel drives idemtest's sentinel keys into real database failures
// (Failure) through the engine and checks that no form of the key leaves
// it; WhileLocked is the usual shape of such a failure.
//
// Every case opens its own Env; none skips. Like core's other kits, txtest
// uses the standard library only.
package txtest
