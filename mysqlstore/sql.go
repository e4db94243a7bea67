package mysqlstore

import (
	"fmt"
	"strings"
)

// statements holds the SQL text of every statement the store runs, built
// once per Store from its configuration and prepared once per connection
// (database/sql's *sql.Stmt): in steady state every call is one round trip
// (COM_STMT_EXECUTE).
type statements struct {
	claim     string // CALL of the claim procedure (migration 0006)
	claimNew  string // CALL of the new key's claim (migration 0007)
	heartbeat string
	complete  string
	fail      string
	get       string
	sweep     string
	sweepToks string
	now       string
	loadSteps string
	saveStep  string
	// Tx's commit marks (migration 0005). markIns and markDel are
	// completed with the token as an integer literal (and ")" for markIns): sent as plain text on the
	// transaction's connection, each is one round trip (a statement with
	// arguments would cost a prepare unless it was prepared already).
	markIns  string
	markDel  string
	markRead string // a locking read: waits for a commit of the mark still in flight
	// markSeen is completed with the token: whether the transaction it
	// runs in sees its mark (Fail's check, see Fail).
	markSeen string
	oldMarks string // marks past markTTL, the candidates of Sweep
	// heldMarks and dropMarks are completed with a list of tokens as
	// integer literals and ")".
	heldMarks string
	dropMarks string
	// completeMarked is complete in Tx's transaction: it matches only
	// while the transaction's commit mark is there (see completeInTx).
	completeMarked string
}

const (
	// fenceWhere: scope, key, token. A processing record past retention
	// with a lapsed lease is treated as absent (Claim would create it anew),
	// as memstore and pgstore do.
	fenceWhere = "scope = ? AND `key` = ? AND token = ? AND status = 'processing'" +
		" AND (expires_at > {{NOW}} OR locked_until > {{NOW}})"

	// epochUS turns a DATETIME(6) into microseconds since the Unix epoch:
	// the store reads every instant as an integer, so it works whatever the
	// DSN's parseTime and loc say.
	epochUS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', %s)"
)

func us(col string) string { return fmt.Sprintf(epochUS, col) }

// clock is the store's clock as an SQL expression: UTC_TIMESTAMP(6), not
// NOW(6), so UTC whatever the server's and the session's time_zone
// (shifted in tests by withClockOffset).
func (c config) clock() string {
	if c.ClockOffset != 0 {
		return fmt.Sprintf("(UTC_TIMESTAMP(6) + INTERVAL %d MICROSECOND)", c.ClockOffset.Microseconds())
	}
	return "UTC_TIMESTAMP(6)"
}

func buildStatements(c config) statements {
	n := c.names()
	now := c.clock()
	var s statements
	s.claim = "CALL " + n.claimProc + "(?, ?, ?, ?, ?, ?, ?, ?)"
	s.claimNew = "CALL " + n.claimNew + "(?, ?, ?, ?, ?, ?, ?, ?)"
	s.get = "SELECT method, route, fingerprint, status, token, " +
		us("locked_until") + ", " + us("created_at") + ", " + us("expires_at") + ",\n" +
		"       resp_status, resp_header, resp_body, resp_not_retained, FALSE, " + us("{{NOW}}") + "\n" +
		"FROM " + n.table + " WHERE scope = ? AND `key` = ?"
	// The new locked_until is bumped by 1µs when it equals the old one, so
	// a heartbeat always changes the row: without CLIENT_FOUND_ROWS (the
	// driver's default) the affected-row count only counts changed rows.
	// Args: extension (µs) twice, then the fence.
	s.heartbeat = "UPDATE " + n.table + " SET locked_until = IF(locked_until = {{NOW}} + INTERVAL ? MICROSECOND,\n" +
		"    locked_until + INTERVAL 1 MICROSECOND, {{NOW}} + INTERVAL ? MICROSECOND)\nWHERE " + fenceWhere
	// Args: status, header, body, not retained, then the fence.
	// Complete drops the steps (migration 0004): a completed record cannot
	// be taken over, so nobody will read them.
	s.complete = "UPDATE " + n.table + " SET status = 'completed', completed_at = {{NOW}}, steps = NULL,\n" +
		"    resp_status = ?, resp_header = ?, resp_body = ?, resp_not_retained = ?\nWHERE " + fenceWhere
	// A record whose commit mark landed (Tx's transaction committed, by the
	// handler or implicitly by the server) is never released: its writes
	// are in, and a retry would run them again (Fail tells that from a lost
	// lease). The mark's read is a primary-key lookup.
	s.fail = "UPDATE " + n.table + " SET status = 'failed' WHERE " + fenceWhere +
		"\n  AND NOT EXISTS (SELECT 1 FROM " + n.txMarks + " WHERE " + n.txMarks + ".token = " + n.table + ".token)"
	s.completeMarked = s.complete +
		"\n  AND EXISTS (SELECT 1 FROM " + n.txMarks + " WHERE " + n.txMarks + ".token = " + n.table + ".token)"
	// Sweep: bounded batch, oldest first. Args: margin (µs), batch.
	s.sweep = "DELETE FROM " + n.table + "\nWHERE expires_at <= {{NOW}} - INTERVAL ? MICROSECOND\n" +
		"  AND NOT (status = 'processing' AND locked_until > {{NOW}})\nORDER BY expires_at LIMIT ?"
	// Token draws below the newest are history: the AUTO_INCREMENT counter
	// is persistent, and the newest row stays anyway. The derived table
	// lets the statement read the table it deletes from. Args: batch.
	s.sweepToks = "DELETE FROM " + n.tokens + " WHERE id < (SELECT m FROM (SELECT MAX(id) AS m FROM " + n.tokens + ") x)\n" +
		"ORDER BY id LIMIT ?"
	s.now = "SELECT " + us("{{NOW}}")
	// Steps (migration 0004). The document's "born" is created_at in µs as
	// a string; a document born for an earlier incarnation is replaced.
	// Args: JSON path ("$.h" + hex name), base64 result, then the fence.
	born := "CAST(" + us("created_at") + " AS CHAR)"
	s.loadSteps = "SELECT steps, " + us("created_at") + " FROM " + n.table + " WHERE " + fenceWhere
	s.saveStep = "UPDATE " + n.table + " SET steps = JSON_SET(\n" +
		"    IF(steps IS NOT NULL AND JSON_UNQUOTE(JSON_EXTRACT(steps, '$.born')) = " + born + ",\n" +
		"       steps, JSON_OBJECT('born', " + born + ")),\n" +
		"    ?, ?)\nWHERE " + fenceWhere

	s.markIns = "INSERT INTO " + n.txMarks + " (created_at, token) VALUES ({{NOW}}, "
	s.markDel = "DELETE FROM " + n.txMarks + " WHERE token = "
	s.markSeen = "SELECT COUNT(*) FROM " + n.txMarks + " WHERE token = "
	s.markRead = "SELECT COUNT(*) FROM " + n.txMarks + " WHERE token = ? LOCK IN SHARE MODE"
	// Args: age (µs), batch.
	s.oldMarks = "SELECT token FROM " + n.txMarks + " WHERE created_at <= {{NOW}} - INTERVAL ? MICROSECOND AND token > ? ORDER BY token LIMIT ?"
	// The marks a record still needs: processing under the mark's token,
	// within retention (the takeover would find the mark; see Sweep).
	s.heldMarks = "SELECT token FROM " + n.table + " WHERE status = 'processing' AND expires_at > {{NOW}} AND token IN ("
	s.dropMarks = "DELETE FROM " + n.txMarks + " WHERE token IN ("

	r := strings.NewReplacer("{{NOW}}", now)
	for _, p := range []*string{&s.claim, &s.heartbeat, &s.complete, &s.completeMarked, &s.fail, &s.get, &s.sweep, &s.sweepToks, &s.now, &s.loadSteps, &s.saveStep,
		&s.markIns, &s.markDel, &s.markSeen, &s.markRead, &s.oldMarks, &s.heldMarks, &s.dropMarks} {
		*p = r.Replace(*p)
	}
	return s
}
