// Package mysqlstore is the MySQL and MariaDB store of idem: the core.Store
// that makes idem's guarantees hold across every process sharing one
// database, on database/sql with github.com/go-sql-driver/mysql. It needs
// MySQL 8.0+ or MariaDB 10.6+ (tested on MariaDB 10.11), and supports
// MariaDB Galera clusters.
//
// # Use
//
//	db, _ := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	if err := mysqlstore.Migrate(ctx, db); err != nil { ... } // at start-up, from every instance
//	store, _ := mysqlstore.New(db)
//	eng, _ := core.New(store)
//	go func() { for range time.Tick(10 * time.Minute) { _ = store.Maintain(ctx) } }()
//
// # Guarantees
//
// Ownership is decided by the database. A claim that takes a key is one
// CALL of a stored procedure: a new key's draws a lease token and inserts
// the record, nothing read; the general one reads the record and, only when
// the key is claimable, draws a token and inserts or takes the record over
// with INSERT ... ON DUPLICATE KEY UPDATE under the row lock. A key that
// is not claimable (a replay, a duplicate in flight) is answered by a
// plain SELECT: after the new key's CALL found the key, while most claims
// are of new keys (two round trips for a replay), or first once half of
// recent claims find their key (one). Every write of an
// owner (Heartbeat, Complete, Fail) is one UPDATE fenced by
// WHERE token = ? AND status = 'processing'. Tokens come from an
// AUTO_INCREMENT counter, so they are strictly increasing and never reused,
// even after a record is deleted. Every instant is the server's
// UTC_TIMESTAMP(6); the application's clock is never compared with it. Keys
// and scopes are VARBINARY: compared byte for byte ("k", "K" and "k " are
// three records). One round trip per phase but as said for a claim:
// claim, heartbeat, complete, fail, get (TestQueryCounts asserts it).
//
// # Transactional mode
//
// A handler that writes to the same database calls Tx(ctx) to get the
// *sql.Tx bound to its lease. It does its business writes there and does
// not commit: when the engine commits the response, Complete runs its fenced
// UPDATE in that transaction and commits it, so the business writes and the
// stored response land together or not at all, and a stale owner's writes
// roll back. sqlx, GORM and ent run on that *sql.Tx too (README). A handler
// that ends the transaction itself gets its response recorded only if its
// writes committed (a commit mark in the transaction tells; see Tx).
//
// Writes whose results the handler does not need before it answers (a
// ledger row, an outbox message) can instead be queued with Defer: they run
// when the engine commits the response, in its transaction (Tx's, or one
// Complete begins for them), so no transaction is open and no connection is
// held while the handler runs. A deferred statement the server refuses
// rolls back everything with it and the key is released
// (storekit.ErrNotCommitted).
//
// # Galera
//
// A deadlock or certification conflict (error 1213) on a claim is retried
// and the loser answers like any duplicate; claims and Get read causally
// (wsrep_sync_wait) on Galera nodes. See the README.
//
// # Recovery points
//
// The store implements storekit.StepStore (core.Step): a step's result is one
// fenced UPDATE of a JSON document in the record's own row, so that on
// Galera a stale owner's step and another node's takeover conflict.
//
// # Retention
//
// Sweep deletes expired records in batches; Maintain loops it.
package mysqlstore
