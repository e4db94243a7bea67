package sqlitestore

import (
	"fmt"
	"strings"
)

// statements holds the SQL text of every statement the store runs, built
// once per Store from its configuration and prepared once per connection.
type statements struct {
	now, get                     string
	drawToken, upsert, markClaim string
	heartbeat, complete, fail    string
	loadSteps, saveStep          string
	markIns, markDel, markRead   string
	sweep, sweepMarks            string
}

// recordCols is the column list Get, the claim and Inspect scan (scanRecord).
const recordCols = "method, route, fingerprint, status, token, locked_until, created_at, expires_at,\n" +
	"       resp_status, resp_header, resp_body, resp_not_retained"

// fenceWhere: scope, key, token. A processing record past retention with a
// lapsed lease is treated as absent (Claim would create it anew), as the
// other stores do.
var fenceWhere = fenceOn("")

// fenceOn is fenceWhere on the columns of table alias a ("" or "r.").
func fenceOn(a string) string {
	return a + "scope = ? AND " + a + "key = ? AND " + a + "token = ? AND " + a + "status = 'processing'" +
		" AND (" + a + "expires_at > {{NOW}} OR " + a + "locked_until > {{NOW}})"
}

// clock is SQLite's clock in µs since the Unix epoch: unixepoch('subsec')
// has millisecond resolution, and is the same for every use within one
// statement. Shifted in tests by withClockOffset.
func (c config) clock() string {
	e := "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)"
	if c.ClockOffset != 0 {
		e = fmt.Sprintf("(%s + %d)", e, c.ClockOffset.Microseconds())
	}
	return e
}

func buildStatements(c config) statements {
	n := c.names()
	var s statements
	s.now = "SELECT {{NOW}}"
	s.get = "SELECT " + recordCols + ", {{NOW}}\nFROM " + n.table + " WHERE scope = ? AND key = ?"
	// The claim's first statement: a write, so the transaction takes
	// SQLite's write lock (waiting under busy_timeout) before it reads
	// anything, and no other writer can change the record until it commits.
	s.drawToken = "UPDATE " + n.tokens + " SET last = last + 1 WHERE id = 1 RETURNING last"
	// Args: scope, key, method, route, fingerprint, token, locked_until,
	// created_at, expires_at (µs; the claim computed them from one clock read).
	s.upsert = "INSERT INTO " + n.table + " (scope, key, method, route, fingerprint, status, token,\n" +
		"    locked_until, created_at, expires_at, completed_at, resp_status, resp_header, resp_body, resp_not_retained)\n" +
		"VALUES (?, ?, ?, ?, ?, 'processing', ?, ?, ?, ?, NULL, NULL, NULL, NULL, 0)\n" +
		"ON CONFLICT (scope, key) DO UPDATE SET method = excluded.method, route = excluded.route,\n" +
		"    fingerprint = excluded.fingerprint, status = 'processing', token = excluded.token,\n" +
		"    locked_until = excluded.locked_until, created_at = excluded.created_at, expires_at = excluded.expires_at,\n" +
		"    completed_at = NULL, resp_status = NULL, resp_header = NULL, resp_body = NULL, resp_not_retained = 0"
	// A takeover finding the previous owner's commit mark completes the
	// record as not retained instead (see Tx). Args: now, scope, key, token.
	s.markClaim = "UPDATE " + n.table + " SET status = 'completed', completed_at = ?, resp_status = 500,\n" +
		"    resp_header = NULL, resp_body = x'', resp_not_retained = 1\n" +
		"WHERE scope = ? AND key = ? AND token = ? AND status = 'processing'"
	// Args: extension (µs), then the fence. SQLite counts matched rows, so
	// an unchanged locked_until still reports the match.
	s.heartbeat = "UPDATE " + n.table + " SET locked_until = {{NOW}} + ? WHERE " + fenceWhere
	// Args: status, header, body, not retained, then the fence. A trigger
	// deletes the record's steps.
	s.complete = "UPDATE " + n.table + " SET status = 'completed', completed_at = {{NOW}},\n" +
		"    resp_status = ?, resp_header = ?, resp_body = ?, resp_not_retained = ?\nWHERE " + fenceWhere
	s.fail = "UPDATE " + n.table + " SET status = 'failed' WHERE " + fenceWhere
	// Steps: the record's created_at names its incarnation. Args: the fence.
	s.loadSteps = "SELECT s.name, s.result FROM " + n.table + " r\n" +
		"LEFT JOIN " + n.steps + " s ON s.scope = r.scope AND s.key = r.key AND s.born = r.created_at\n" +
		"WHERE " + fenceOn("r.")
	// Args: name, result, then the fence. Inserts nothing when the fence
	// does not match. ("WHERE true" resolves the parser's upsert ambiguity.)
	s.saveStep = "INSERT INTO " + n.steps + " (scope, key, name, born, result)\n" +
		"SELECT scope, key, ?, created_at, ? FROM " + n.table + " WHERE " + fenceWhere + "\n" +
		"ON CONFLICT (scope, key, name) DO UPDATE SET born = excluded.born, result = excluded.result"
	s.markIns = "INSERT INTO " + n.txMarks + " (token, created_at) VALUES (?, {{NOW}})"
	s.markDel = "DELETE FROM " + n.txMarks + " WHERE token = ?"
	s.markRead = "SELECT COUNT(*) FROM " + n.txMarks + " WHERE token = ?"
	// Args: margin (µs), batch. Oldest first, bounded.
	s.sweep = "DELETE FROM " + n.table + " WHERE (scope, key) IN (SELECT scope, key FROM " + n.table + "\n" +
		"    WHERE expires_at <= {{NOW}} - ? AND NOT (status = 'processing' AND locked_until > {{NOW}})\n" +
		"    ORDER BY expires_at LIMIT ?)"
	// Args: age (µs), batch. A mark a record still needs stays: one
	// processing under the mark's token within retention, whose takeover
	// reads it (see claimWrite), however long the retention. The NOT IN
	// list (a scan of the table: no index on token) is built once, and
	// only when a mark is past the age.
	s.sweepMarks = "DELETE FROM " + n.txMarks + " WHERE token IN (SELECT token FROM " + n.txMarks +
		" WHERE created_at <= {{NOW}} - ?\n" +
		"    AND token NOT IN (SELECT token FROM " + n.table + " WHERE status = 'processing' AND expires_at > {{NOW}})\n" +
		"    ORDER BY token LIMIT ?)"

	r := strings.NewReplacer("{{NOW}}", c.clock())
	for _, p := range []*string{&s.now, &s.get, &s.drawToken, &s.upsert, &s.markClaim, &s.heartbeat, &s.complete,
		&s.fail, &s.loadSteps, &s.saveStep, &s.markIns, &s.markDel, &s.markRead, &s.sweep, &s.sweepMarks} {
		*p = r.Replace(*p)
	}
	return s
}
