// Package pgstore is the PostgreSQL store of idem: the core.Store that makes
// idem's guarantees hold across every process and machine sharing one
// database. It is built on pgx/v5 and needs PostgreSQL 12 or later (tested
// on 15).
//
// # Use
//
//	pool, _ := pgxpool.New(ctx, dsn)
//	if err := pgstore.Migrate(ctx, pool); err != nil { ... } // at start-up, from every instance
//	store, _ := pgstore.New(pool)
//	eng, _ := core.New(store)
//	go func() { for range time.Tick(10 * time.Minute) { _ = store.Maintain(ctx) } }()
//
// # Guarantees
//
// Ownership is decided by the database. Claim is one statement that
// inserts the record, takes it over (failed, or processing with a lapsed
// lease, same request) or returns it unchanged (while new keys dominate, a
// bare insert first and that statement only for an existing key, see
// Store.Claim); every write of an owner
// (Heartbeat, Complete, Fail) is one UPDATE fenced by
// WHERE token = $token AND status = 'processing'. Lease tokens come from a
// sequence, so they are strictly increasing and never reused, even after a
// record is deleted. Every instant is the database's now(); the
// application's clock is never compared with it. One statement per phase:
// claim, heartbeat, complete, fail, get (TestTxContract's QueryCounts and
// TestQueryCountsClaim assert it).
//
// # Steps
//
// The store implements storekit.StepStore (core.Step's recovery points) with the
// table of migration 0005: each step is one fenced INSERT, committed on its
// own (outside the handler's Tx) and synchronously, before Step returns; a
// step's rows go with its record.
//
// # Transactional mode
//
// A handler that writes to the same database calls Tx(ctx) to get a
// pgx.Tx bound to its lease. It does its business writes there and does not
// commit: when the engine commits the response, Complete runs its fenced
// update in that transaction and commits it, so the business writes and the
// stored response are one atomic fact. A stale owner (its lease lapsed, a
// retry took the key over) fails the fence: its transaction is rolled back
// and its writes vanish; the engine answers it 409. An aborted execution
// (error, panic, 5xx) rolls the transaction back. BEGIN travels with the
// handler's first statement and the fenced update with COMMIT, so a first
// execution is three round trips; with WithTransactional the claim does not
// wait for its WAL flush (the business commit flushes it), so it is one WAL
// flush. See README.md, "Synchronous and asynchronous commits".
//
// Code written against database/sql (GORM, sqlx, ent, bun) calls SQLTx(ctx)
// instead: the same lease transaction as a *sql.Tx, on a connection of
// the same pool through pgx's stdlib driver, with the same guarantees (its
// Commit and Rollback are refused with ErrTxOwned; COMMIT or ROLLBACK sent
// as SQL is detected as for Tx). Use Tx when the handler speaks pgx, SQLTx
// when it speaks database/sql; SQLTx sends BEGIN at once (one round trip
// more than Tx). See README.md, "Tx or SQLTx".
//
// Writes whose results the handler does not need before it answers (a
// ledger row, an outbox message) can instead be queued with Defer: they
// run when the engine commits the response, in its transaction and in the
// same round trip as the fenced complete, so a first execution that writes
// only that way is two round trips. A deferred statement that fails rolls
// back everything with it and the key is released (storekit.ErrNotCommitted).
//
// # Waiting duplicates
//
// Store implements storekit.Watcher: in wait mode (core.WithWait) a duplicate
// waiting for an in-flight key is woken by LISTEN/NOTIFY when the owner
// completes or fails, in any instance. Only waiters pay for it: a waiter
// marks the record, and Complete and Fail send a NOTIFY (in its own
// statement, after the record's commit) only for a marked record. See
// README.md, "Waking waiters".
//
// # Retention
//
// Two modes. Plain (default): one table; Sweep (and Maintain) delete
// expired rows in bounded batches. Partitioned (WithPartitioning): a small
// claim table keyed by (scope, key) enforces uniqueness, and response
// payloads live in a table range-partitioned by day that Maintain drops whole
// once a day's payloads are all past retention. See README.md for the DDL,
// the design, pool sizing, maintenance, and which statements need
// PostgreSQL itself rather than a compatible engine.
//
// # Errors
//
// Every method returns errors prefixed "pgstore: <operation>:" that wrap
// the cause (pgx errors, *pgconn.PgError with its SQLSTATE, context errors,
// core.ErrLeaseLost, storekit.ErrNotFound); nothing panics on connection loss,
// serialization failures or a full pool.
//
// Package pgstoretest is test support: a pool on the test database and a
// fresh schema per test, for idem's tests and for your handlers' tests.
package pgstore
