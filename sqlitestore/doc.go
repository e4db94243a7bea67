// Package sqlitestore is the SQLite store of idem: a durable core.Store for
// services that run on one host with no database server (internal tools,
// edge services, CLIs that call payment APIs). Keys survive a restart, so a
// retry after a crash replays instead of running the handler again. It is
// built on database/sql and modernc.org/sqlite, a pure-Go driver (no cgo).
//
// # Use
//
//	db, _ := sqlitestore.OpenDB(ctx, "/var/lib/app/idem.db") // WAL, busy_timeout, synchronous=FULL
//	if err := sqlitestore.Migrate(ctx, db); err != nil { ... }
//	store, _ := sqlitestore.New(db)
//	eng, _ := core.New(store)
//	go func() { for range time.Tick(10 * time.Minute) { _ = store.Maintain(ctx) } }()
//
// # Guarantees
//
// SQLite has one writer per database file, and its file locks hold across
// processes: ownership is decided by the write lock. A claim reads first
// (WAL readers never wait), and only when the key is missing or claimable
// opens a write transaction whose first statement draws the lease token
// (taking the lock), then re-reads the record and the clock and upserts.
// Every owner's write (Heartbeat, Complete, Fail, SaveStep) is one UPDATE
// fenced by token and status. Concurrent writes of one process share a
// transaction, each in a savepoint of its own, and one fsync (group
// commit); each is answered as if alone, once that transaction committed. Tokens come from a counter row that Sweep
// never touches: strictly increasing, never reused. Every instant is
// SQLite's unixepoch('subsec') (millisecond resolution), never the
// caller's. Keys and scopes are BLOBs compared byte for byte.
//
// # Transactional mode
//
// Tx(ctx) gives the handler a *sql.Tx on the same file; Complete runs its
// fenced UPDATE in it and commits, so the business writes and the stored
// response are one atomic fact. The transaction holds SQLite's write lock
// from Tx to Complete: other writers wait (busy_timeout). Its own
// heartbeats run inside it and SaveStep refuses with ErrStepInTx, so an
// execution never waits for a lock it holds. A handler that commits or
// rolls back the transaction itself is caught by a commit mark, as in
// mysqlstore (storekit.ErrNotCommitted).
//
// Writes whose results the handler does not need before it answers (a
// ledger row, an outbox message) can instead be queued with Defer: they
// run when the engine commits the response, in its transaction (the Tx
// one, or a write transaction Complete begins), so the write lock is not
// held while the handler runs. A deferred statement that fails rolls back
// everything with it and the key is released (storekit.ErrNotCommitted).
//
// # Limits
//
// One host. Several processes may open the same file (tested: two
// processes, concurrent duplicates, SIGKILLs); a network file system (NFS,
// SMB) may not, its locks are not reliable. Writes are serialised: a
// write alone costs a transaction and an fsync (synchronous=FULL with
// OpenDB), concurrent ones share them. The database must be a file, not :memory:. See README.md.
package sqlitestore
