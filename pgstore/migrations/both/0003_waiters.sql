-- Waiters (pgstore's core.Watcher, watch.go): a duplicate that waits for an
-- in-flight record sets waiters = true on it (one UPDATE, on the waiter's
-- path); the owner's complete and fail statements return the flag, and only
-- when it is set does the store send a NOTIFY, in its own short transaction
-- after the record's. The claim/complete path of a request nobody waits for
-- pays nothing: a NOTIFY inside the completing transaction would serialise
-- every commit (BENCHMARKS.md §3.1).
--
-- A constant default: no table rewrite (PostgreSQL 11+).
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS waiters boolean NOT NULL DEFAULT false;
