package pgstore

import (
	"fmt"
	"strings"
)

// statements holds the SQL text of every statement the store runs on its
// hot path, built once per Store from its configuration. pgx prepares and
// caches each per connection (QueryExecModeCacheStatement, its default), so
// in steady state every call is one round trip: Bind/Execute/Sync.
type statements struct {
	claim     string
	claimText string
	claimNew  string // a claim's first statement while new keys dominate (Claim)
	claimNews string // the same for several claims at once (claimbatch.go, WithTransactional)
	claimFns  string // the claim function for several claims at once (claimbatch.go)
	heartbeat string
	syncClaim string
	complete  string
	// completeTx: complete inside the handler's transaction; raises
	// leaseLostMarker when the fence matches nothing.
	completeTx string
	fail       string
	mark       string
	get        string
	sweep      string
	now        string
}

// The store calls the claim function of migration 0004 (one statement, one
// composite value; 0002's set-returning version is kept for older
// binaries): it tries a bare INSERT ... ON CONFLICT DO NOTHING, and only
// when the key exists runs the claim-or-read statement below (claimFull),
// unchanged. (Sending the fast path as plain SQL in the statement, with the
// slow path in a gated UNION ALL branch, was measured slower for first
// executions and replays alike: BENCHMARKS.md §2.)
//
// The claim-or-read statement, in both modes, is one statement with three
// parts (CTEs):
//
//   - e: read the row as the statement's snapshot sees it, keeping it only
//     if it is NOT claimable (completed and unexpired, processing under a
//     live lease, or failed with another fingerprint). Such a row is the
//     answer: returning the snapshot's version is linearizable (the snapshot
//     is taken within the call), and the common retry (a replay of a
//     completed key) or in-flight duplicate costs a pure read: no row lock,
//     no WAL, no commit flush.
//   - c: otherwise (no row visible, or a claimable one),
//     INSERT ... ON CONFLICT (scope, key) DO UPDATE SET col = CASE WHEN
//     <claim> ...: the insert or takeover happens under the row lock, on the
//     latest committed version. The DO UPDATE has no WHERE: when the claim
//     condition turns out false on the latest version (a concurrent request
//     claimed first, after our snapshot), every column is set to its current
//     value, so RETURNING still yields the row the decision was made on.
//     (The alternative, DO UPDATE ... WHERE plus a fallback SELECT, reads the
//     statement's snapshot, which in READ COMMITTED can predate the
//     concurrent insert ON CONFLICT saw: it would return no row at all, or a
//     stale version.) This path writes a row version even when it does not
//     claim; it is only taken when the snapshot said the key was claimable.
//   - x: the one row from c or e.
//
// Whether the caller claimed is decided by comparing the returned token with
// the token this statement drew from the sequence (v.tok): tokens are never
// handed out twice, so equality means this statement wrote it.
//
// The guard "r.token < excluded.token" makes tokens strictly increasing per
// key even in the pathological case of a statement that drew its token,
// then stalled on the row lock for longer than a whole lease while a later
// statement took the row over: it then reports the existing record instead
// of installing a smaller token.

const (
	// expired: the existing row is past retention and not held by a live
	// lease: the key is new again (fingerprint irrelevant, CreatedAt reset).
	condExpired = `(r.expires_at <= excluded.created_at AND NOT (r.status = 'processing' AND r.locked_until > excluded.created_at))`
	// takeover: same request, and failed or processing with a lapsed lease.
	condTakeover = `(r.method = excluded.method AND r.route = excluded.route AND r.fingerprint = excluded.fingerprint` +
		` AND (r.status = 'failed' OR (r.status = 'processing' AND r.locked_until <= excluded.created_at)))`
	condClaim = `(r.token < excluded.token AND (` + condExpired + ` OR ` + condTakeover + `))`
	condNew   = `(r.token < excluded.token AND ` + condExpired + `)`

	// condClaimableSnapshot is the same test as condClaim, for the snapshot
	// read (v.now is the statement's clock, $3-$5 the request).
	condClaimableSnapshot = `((r.expires_at <= v.now AND NOT (r.status = 'processing' AND r.locked_until > v.now))` +
		` OR (r.method = $3 AND r.route = $4 AND r.fingerprint = $5` +
		` AND (r.status = 'failed' OR (r.status = 'processing' AND r.locked_until <= v.now))))`

	// fenceWhere: $1 scope, $2 key, $3 token. A processing record that is
	// past retention with a lapsed lease is treated as absent (Claim would
	// create it anew), as memstore does.
	fenceWhere = `scope = $1 AND key = $2 AND token = $3 AND status = 'processing'` +
		` AND (expires_at > {{NOW}} OR locked_until > {{NOW}})`

	recordCols = `scope, key, method, route, fingerprint, status, token, locked_until, created_at, expires_at`

	// asyncCTE makes the statement's own (implicit) transaction commit
	// without waiting for its WAL flush: set_config(..., true) is SET LOCAL,
	// and synchronous_commit is read at commit. As a CTE of the statement it
	// costs no round trip (a SET LOCAL would cost one, and needs a
	// transaction block). A statement that writes nothing commits nothing,
	// so whether the CTE runs then does not matter.
	asyncCTE = `WITH async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) AS sc)
`

	// syncWhere, a condition of a write's WHERE clause, makes its
	// transaction wait for its WAL flush even where the session runs with
	// synchronous_commit = off: set_config(..., true) is SET LOCAL, read at
	// commit (the handler's pipelined COMMIT, or the implicit one).
	// PostgreSQL-only (set_config, current_setting).
	syncWhere = ` AND CASE WHEN current_setting('synchronous_commit') = 'off'
           THEN set_config('synchronous_commit', 'on', true) IS NOT NULL
           ELSE true END`

	// leaseLostMarker is the text of the error the in-transaction complete
	// raises when its fence matches nothing (see completeTx).
	leaseLostMarker = "idem: lease lost"
)

// claimSet is the DO UPDATE SET clause of the claim: the claim conditions
// are evaluated once, in a one-row sub-SELECT k, on the locked latest row
// version r; every column is either set from the new claim (excluded) or
// kept.
func claimSet(partitioned bool) string {
	cols := []string{"method", "route", "fingerprint", "status", "token", "locked_until", "created_at", "expires_at", "completed_at"}
	vals := []string{
		`CASE WHEN k.claim THEN excluded.method ELSE r.method END`,
		`CASE WHEN k.claim THEN excluded.route ELSE r.route END`,
		`CASE WHEN k.claim THEN excluded.fingerprint ELSE r.fingerprint END`,
		`CASE WHEN k.claim THEN 'processing' ELSE r.status END`,
		`CASE WHEN k.claim THEN excluded.token ELSE r.token END`,
		`CASE WHEN k.claim THEN excluded.locked_until ELSE r.locked_until END`,
		`CASE WHEN k.fresh THEN excluded.created_at ELSE r.created_at END`,
		`CASE WHEN k.claim THEN excluded.expires_at ELSE r.expires_at END`,
		`CASE WHEN k.claim THEN NULL ELSE r.completed_at END`,
	}
	if !partitioned {
		cols = append(cols, "resp_status", "resp_header", "resp_body", "resp_not_retained")
		vals = append(vals,
			`CASE WHEN k.claim THEN NULL ELSE r.resp_status END`,
			`CASE WHEN k.claim THEN NULL ELSE r.resp_header END`,
			`CASE WHEN k.claim THEN NULL ELSE r.resp_body END`,
			`CASE WHEN k.claim THEN false ELSE r.resp_not_retained END`,
		)
	}
	return `(` + strings.Join(cols, ", ") + `) = (
      SELECT ` + strings.Join(vals, ",\n             ") + `
      FROM (SELECT ` + condClaim + ` AS claim,
                   ` + condNew + ` AS fresh) k)`
}

// claimFullSQL is the full claim-or-read statement (see above) as the body
// of the claim function's slow path (migration 0002): the clock is the
// function's 8th parameter.
func claimFullSQL(c config) string {
	return strings.ReplaceAll(claimFull(c), "{{NOW}}", "$8")
}

// claimFullIntoSQL is claimFullSQL with its one row selected INTO the
// composite variable o of the claim function of migration 0004.
func claimFullIntoSQL(c config) (string, error) {
	const from = "\nFROM x CROSS JOIN v"
	q := claimFullSQL(c)
	if strings.Count(q, from) != 1 {
		// A change to claimFull above; caught by every test that migrates.
		return "", fmt.Errorf("claim statement: no single %q to select INTO", from)
	}
	return strings.Replace(q, from, "\nINTO o"+from, 1), nil
}

// claimReadIntoSQL is the read that the claim function of migration 0006
// tries first: the record as the statement's snapshot sees it, kept only if
// it is NOT claimable (claimFull's CTE e), selected INTO the composite o
// with claimed = false. A replay or an in-flight duplicate is answered by
// this one index lookup; only a new or claimable key goes on to the INSERT
// (and, if the key exists, to claimFull). Parameters are the function's:
// $1-$7 as in claimFull, $8 the clock.
func claimReadIntoSQL(c config) string {
	n := c.names()
	cond := strings.ReplaceAll(condClaimableSnapshot, "v.now", "$8")
	if !c.partitioned {
		return `SELECT r.scope, r.key, r.method, r.route, r.fingerprint, r.status, r.token,
       r.locked_until, r.created_at, r.expires_at,
       r.resp_status, r.resp_header, r.resp_body, r.resp_not_retained, r.resp_status IS NOT NULL,
       false, $8
INTO o
FROM ` + n.table + ` r
WHERE r.scope = $1 AND r.key = $2 AND NOT ` + cond
	}
	return `SELECT r.scope, r.key, r.method, r.route, r.fingerprint, r.status, r.token,
       r.locked_until, r.created_at, r.expires_at,
       p.resp_status, p.resp_header, p.resp_body, coalesce(p.resp_not_retained, false), p.scope IS NOT NULL,
       false, $8
INTO o
FROM ` + n.table + ` r
LEFT JOIN LATERAL (
  SELECT * FROM ` + n.payload + `
  WHERE scope = r.scope AND key = r.key AND token = r.token AND stored_at = r.completed_at
  LIMIT 1 -- keeps the subquery from being flattened: pruned at run time
) p ON true
WHERE r.scope = $1 AND r.key = $2 AND NOT ` + cond
}

// claimFull is the claim-or-read statement, {{NOW}} standing for the clock.
func claimFull(c config) string {
	n := c.names()
	// Parameters: $1 scope, $2 key, $3 method, $4 route, $5 fingerprint,
	// $6 lease (µs), $7 retention (µs).
	claim := `WITH v AS (SELECT {{NOW}} AS now),
t AS (SELECT nextval('` + n.seq + `'::regclass) AS tok),
e AS (
  SELECT r.* FROM ` + n.table + ` r CROSS JOIN v
  WHERE r.scope = $1 AND r.key = $2 AND NOT ` + condClaimableSnapshot + `
),
c AS (
  INSERT INTO ` + n.table + ` AS r (` + recordCols + `)
  SELECT $1, $2, $3, $4, $5, 'processing', t.tok,
         v.now + $6::bigint * interval '1 microsecond', v.now,
         v.now + $7::bigint * interval '1 microsecond'
  FROM v CROSS JOIN t
  WHERE NOT EXISTS (SELECT 1 FROM e)
  ON CONFLICT (scope, key) DO UPDATE SET
    ` + claimSet(c.partitioned) + `
  RETURNING r.*
),
x AS (
  SELECT c.*, c.token = t.tok AS claimed FROM c CROSS JOIN t
  UNION ALL
  SELECT e.*, false FROM e
)
`
	if !c.partitioned {
		return claim + `SELECT x.scope, x.key, x.method, x.route, x.fingerprint, x.status, x.token,
       x.locked_until, x.created_at, x.expires_at,
       x.resp_status, x.resp_header, x.resp_body, x.resp_not_retained, x.resp_status IS NOT NULL,
       x.claimed, v.now
FROM x CROSS JOIN v`
	}
	return claim + `SELECT x.scope, x.key, x.method, x.route, x.fingerprint, x.status, x.token,
       x.locked_until, x.created_at, x.expires_at,
       p.resp_status, p.resp_header, p.resp_body, coalesce(p.resp_not_retained, false), p.scope IS NOT NULL,
       x.claimed, v.now
FROM x CROSS JOIN v
LEFT JOIN LATERAL (
  SELECT * FROM ` + n.payload + `
  WHERE scope = x.scope AND key = x.key AND token = x.token AND stored_at = x.completed_at
  LIMIT 1 -- keeps the subquery from being flattened: pruned at run time
) p ON true`
}

func buildStatements(c config) statements {
	n := c.names()
	var s statements
	// The claim function (migration 0004): a plain INSERT ... ON CONFLICT
	// DO NOTHING first, claimFull only when the key exists; one composite
	// value, decoded by decodeClaimRow.
	s.claim = `SELECT ` + n.claimRowFn + `($1, $2, $3, $4, $5, $6, $7, {{NOW}})`
	if c.transactional {
		s.claim = asyncCTE + s.claim + ` FROM async`
	}
	// The same call for pools that only get text results: the composite's
	// fields as columns (OFFSET 0 keeps the function to one call), the
	// fast path's NULLs filled in from the request (and reported: the
	// record was inserted, see claimRow.created).
	s.claimText = `SELECT coalesce((c).scope, $1), coalesce((c).key, $2), coalesce((c).method, $3),
       coalesce((c).route, $4), coalesce((c).fingerprint, $5), coalesce((c).status, 'processing'),
       (c).token, (c).locked_until, (c).created_at, (c).expires_at,
       (c).resp_status, (c).resp_header, (c).resp_body, (c).resp_not_retained, (c).has_payload,
       (c).claimed, (c).now, (c).scope IS NULL
FROM (SELECT ` + n.claimRowFn + `($1, $2, $3, $4, $5, $6, $7, {{NOW}}) AS c OFFSET 0) q`
	if c.transactional {
		s.claimText = asyncCTE + strings.Replace(s.claimText, "{{NOW}}) AS c OFFSET 0", "{{NOW}}) AS c FROM async OFFSET 0", 1)
	}
	// Claim's first statement: the function's fast path as the statement itself.
	s.claimNew = `INSERT INTO ` + n.table + ` (` + recordCols + `)
VALUES ($1, $2, $3, $4, $5, 'processing', nextval('` + n.seq + `'::regclass),
        {{NOW}} + $6::bigint * interval '1 microsecond', {{NOW}}, {{NOW}} + $7::bigint * interval '1 microsecond')
ON CONFLICT (scope, key) DO NOTHING
RETURNING token, locked_until, created_at, expires_at, {{NOW}}`
	if c.transactional {
		s.claimNew = asyncCTE + strings.Replace(s.claimNew, "\nVALUES (", "\nSELECT ", 1)
		s.claimNew = strings.Replace(s.claimNew, "{{NOW}} + $7::bigint * interval '1 microsecond')\nON CONFLICT", "{{NOW}} + $7::bigint * interval '1 microsecond'\nFROM async\nON CONFLICT", 1)
	}
	// Several claims in one statement (claimbatch.go): arrays of the same
	// parameters, one element per claim, sorted by (scope, key) so that two
	// batches wait for each other's keys in one order and cannot deadlock.
	s.claimNews = `INSERT INTO ` + n.table + ` (` + recordCols + `)
SELECT u.scope, u.key, u.method, u.route, u.fingerprint, 'processing', nextval('` + n.seq + `'::regclass),
       {{NOW}} + u.lease * interval '1 microsecond', {{NOW}}, {{NOW}} + u.retention * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[])
       AS u(scope, key, method, route, fingerprint, lease, retention)
ON CONFLICT (scope, key) DO NOTHING
RETURNING scope, key, token, locked_until, created_at, expires_at, {{NOW}}`
	// The claim function once per claim, in the arrays' (sorted) order: a
	// call sees the rows of the calls before it. The position tells which
	// claim a row answers (the fast path's composite names no key).
	s.claimFns = `SELECT u.i, ` + n.claimRowFn + `(u.scope, u.key, u.method, u.route, u.fingerprint, u.lease, u.retention, {{NOW}})
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[]) WITH ORDINALITY
       AS u(scope, key, method, route, fingerprint, lease, retention, i)
ORDER BY u.i`
	if c.transactional {
		s.claimNews = asyncCTE + strings.Replace(s.claimNews, "\nFROM unnest(", "\nFROM async, unnest(", 1)
		s.claimFns = asyncCTE + strings.Replace(s.claimFns, "\nFROM unnest(", "\nFROM async, unnest(", 1)
	}
	// The complete waits for its flush in every session (syncWhere): a
	// response the client was given must survive a crash of the database,
	// and so must the business writes committed with it.
	if !c.partitioned {
		s.get = `SELECT ` + recordCols + `,
       resp_status, resp_header, resp_body, resp_not_retained, resp_status IS NOT NULL, {{NOW}}
FROM ` + n.table + ` WHERE scope = $1 AND key = $2`
		s.complete = `UPDATE ` + n.table + `
SET status = 'completed', completed_at = {{NOW}},
    resp_status = $4, resp_header = $5::jsonb, resp_body = $6, resp_not_retained = $7
WHERE ` + fenceWhere + syncWhere + `
RETURNING waiters`
	} else {
		s.get = `SELECT c.scope, c.key, c.method, c.route, c.fingerprint, c.status, c.token,
       c.locked_until, c.created_at, c.expires_at,
       p.resp_status, p.resp_header, p.resp_body, coalesce(p.resp_not_retained, false), p.scope IS NOT NULL, {{NOW}}
FROM ` + n.table + ` c
LEFT JOIN LATERAL (
  SELECT * FROM ` + n.payload + `
  WHERE scope = c.scope AND key = c.key AND token = c.token AND stored_at = c.completed_at
  LIMIT 1 -- keeps the subquery from being flattened: pruned at run time
) p ON true
WHERE c.scope = $1 AND c.key = $2`
		// Data-modifying CTEs: the payload row is inserted only when the
		// fenced update matched, in the same statement (and transaction).
		// The statement returns one row (the waiters flag) when it did.
		s.complete = `WITH c AS (
  UPDATE ` + n.table + ` SET status = 'completed', completed_at = {{NOW}}
  WHERE ` + fenceWhere + syncWhere + `
  RETURNING scope, key, token, completed_at, expires_at, waiters
), p AS (
  INSERT INTO ` + n.payload + ` (scope, key, token, stored_at, expires_at, resp_status, resp_header, resp_body, resp_not_retained)
  SELECT scope, key, token, completed_at, expires_at, $4, $5::jsonb, $6, $7 FROM c
)
SELECT waiters FROM c`
	}
	// The complete inside the handler's transaction, sent in one round trip
	// with its COMMIT: when the fence matches nothing it must abort the
	// transaction, so that the pipelined COMMIT cannot commit the stale
	// owner's business writes. It raises an error (a text that is not a
	// boolean, naming itself: leaseLostMarker) instead of returning no
	// row; PostgreSQL then skips the COMMIT and the store rolls back.
	s.completeTx = completeTxSQL(s.complete, c.partitioned)
	// $4: extension (µs). In transactional mode a heartbeat need not wait
	// for its flush: losing it in a crash loses nothing the crash did not
	// already end (the handler's transaction).
	s.heartbeat = `UPDATE ` + n.table + ` SET locked_until = {{NOW}} + $4::bigint * interval '1 microsecond' WHERE ` + fenceWhere
	if c.transactional {
		s.heartbeat = asyncCTE + `UPDATE ` + n.table + ` SET locked_until = {{NOW}} + $4::bigint * interval '1 microsecond' FROM async WHERE ` + fenceWhere
	}
	// SyncClaim (syncclaim.go): a fenced write that waits for its flush,
	// and so for the asynchronous claim's before it (WAL order). Setting
	// locked_until to itself still writes a row version, hence a commit
	// record to flush; syncWhere: even where the session runs with
	// synchronous_commit = off.
	s.syncClaim = `UPDATE ` + n.table + ` SET locked_until = locked_until WHERE ` + fenceWhere + syncWhere
	// A fail never waits for its flush, in either mode: if a crash loses
	// it, the record stays processing until its lease lapses, which is what
	// a crashed owner leaves anyway.
	s.fail = asyncCTE + `UPDATE ` + n.table + ` SET status = 'failed' FROM async WHERE ` + fenceWhere + ` RETURNING waiters`
	// A waiter marks an in-flight record (migration 0003, watch.go).
	// Asynchronous too: a lost mark only means the waiter polls.
	s.mark = asyncCTE + `UPDATE ` + n.table + ` SET waiters = true FROM async WHERE scope = $1 AND key = $2 AND status = 'processing'`

	// Sweep: bounded batch, oldest first, skipping rows another session
	// holds (a claim in progress). The row lock taken by FOR UPDATE makes
	// the re-check of the condition (READ COMMITTED re-evaluates it on the
	// latest row version) and the delete atomic with respect to claims.
	// $1: margin (µs), $2: batch size.
	s.sweep = `DELETE FROM ` + n.table + ` WHERE (scope, key) IN (
  SELECT scope, key FROM ` + n.table + `
  WHERE expires_at <= {{NOW}} - $1::bigint * interval '1 microsecond'
    AND NOT (status = 'processing' AND locked_until > {{NOW}})
  ORDER BY expires_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`
	s.now = `SELECT {{NOW}}`

	r := nowReplacer(c)
	for _, p := range []*string{&s.claim, &s.claimText, &s.claimNew, &s.claimNews, &s.claimFns, &s.heartbeat, &s.syncClaim, &s.complete, &s.completeTx, &s.fail, &s.mark, &s.get, &s.sweep, &s.now} {
		*p = r.Replace(*p)
	}
	return s
}

// nowReplacer replaces {{NOW}} in a statement with the store's clock: the
// database's now(), shifted by the tests' clock offset.
func nowReplacer(c config) *strings.Replacer {
	now := "now()"
	if c.clockOffset != 0 {
		now = fmt.Sprintf("(now() + interval '%d microseconds')", c.clockOffset.Microseconds())
	}
	return strings.NewReplacer("{{NOW}}", now)
}

// completeTxSQL wraps the complete statement so that it returns its waiters
// flag when the fence matched and raises an error naming leaseLostMarker
// when it did not. The cast of a non-constant text to boolean is the
// raise: plain SQL has no RAISE, and a function would need a migration.
func completeTxSQL(complete string, partitioned bool) string {
	raise := `SELECT CASE WHEN count(*) = 1 THEN bool_or(waiters)
       ELSE ('` + leaseLostMarker + ` (the fenced complete matched ' || count(*) || ' rows); the transaction is rolled back')::boolean END
FROM c`
	if partitioned {
		// Already a CTE statement ending in SELECT waiters FROM c.
		return strings.TrimSuffix(complete, `SELECT waiters FROM c`) + raise
	}
	return `WITH c AS (
` + complete + `
)
` + raise
}
