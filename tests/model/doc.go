// Package model is the idempotency protocol written down as a small
// reference model, and a checker that runs randomized concurrent histories
// against a core.Store and checks each for linearizability against the
// model with porcupine.
//
// The model (model.go) keeps, per (scope, key), the record as the protocol
// defines it: absent, processing (token, lease running or lapsed,
// fingerprint, steps), completed (response) or failed, past retention or
// not, and the largest token handed out. Its step function is the
// protocol: at most one owner at a time, stale tokens refused with
// ErrLeaseLost and changing nothing, tokens strictly increasing, a
// completed response unchanged until expiry, steps kept across takeovers
// of one incarnation and never seen by the next, a fingerprint mismatch
// answered with the existing record unchanged, and, in transactional
// mode, a response recorded exactly when the business write committed
// (and, for mysqlstore and sqlitestore, a handler that committed its own
// transaction never run again: a takeover after its crash, or idem's Fail
// after it, completes its record as not retained).
//
// Time: every claim takes a lease of an hour and a retention of 1000
// hours, so nothing lapses by itself during a history; leases lapse and
// records expire only by the history's own Lapse and Expire steps (an
// operator's UPDATE, or memstore's clock moved forward), which the model
// treats as linearizable steps like any call.
//
// A call that fails with an error the contract does not define as
// "nothing changed" (a killed connection, a timeout) has an unknown
// outcome: the checker lets it take effect at any point after its call,
// or never.
//
// The tests run the model against memstore, pgstore, mysqlstore and
// sqlitestore, each database store plain and transactional (a ledger row
// written in the lease's transaction, audited against the responses
// recorded), with kills of the test's own database connections at random
// points (sqlitestore, which has none: calls whose context ends a moment
// in, and two processes' stores on one file), and against deliberately
// broken stores to show the checker catches them.
// pgstore also runs in the configurations users ship (pgvariants_test.go):
// WithPartitioning, plain and transactional, and with another scope's new
// keys driving the claim across its switch (the bare insert first, the
// function first) during each history: batching pinned, plain and
// transactional, and as examples/payments configures it (ledger rows
// through pgstore.Defer), and a pgx tracer counts the
// claims that took each path (pgmix_test.go). In pgstore's
// transactional runs some handlers commit the lease's transaction
// themselves (CommitCrash with Input.NoMark), through Exec, Query,
// SendBatch or the connection from Conn, and go on: pgstore keeps no
// commit mark, so their Complete or Fail must find out from PostgreSQL
// whether that COMMIT landed, also when a kill lost its answer.
// A rejected history is written out (porcupine's visualization and the
// history as JSON, for testdata/) and explained in the log.
//
// Environment: IDEM_MODEL_ITER sets the number of histories per store
// (make model runs many more than make test); IDEM_MODEL_SEED replays a
// seed's choices (not its interleaving). In mysqlstore's and
// sqlitestore's transactional runs the handler of every other lease ends
// its own transaction before idem completes, as `defer tx.Rollback()` does
// (sqlitestore: or with ROLLBACK sent as SQL; its Complete must answer
// storekit.ErrNotCommitted and record nothing); IDEM_MODEL_DEFER_ROLLBACK=0
// turns that off, =1 makes every handler do it.
package model
