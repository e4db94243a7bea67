-- The claim-or-read as one stored procedure: one round trip (CALL) per
-- claim. MySQL has no INSERT ... RETURNING (MariaDB's does not cover
-- ON DUPLICATE KEY UPDATE), so without a procedure a claim is two round
-- trips (the upsert, then the read). Works on MySQL 8.0+ and MariaDB 10.6+.
--
-- Migrate creates it with a fixed sql_mode (a procedure keeps the sql_mode
-- of its creation): the ON DUPLICATE KEY UPDATE below relies on MySQL's
-- left-to-right assignment order, which MariaDB's SIMULTANEOUS_ASSIGNMENT
-- mode would change.
--
-- Every statement runs in autocommit (the CALL is not wrapped in a
-- transaction), so each takes its own snapshot and commits at once:
--
--  1. a read: is there a row that is NOT claimable (completed and
--     unexpired, processing under a live lease, failed with another
--     request)? Then it is the answer, and a replay or an in-flight
--     duplicate costs two primary-key reads and no lock, no write.
--  2. otherwise draw a token (an AUTO_INCREMENT insert) and
--     INSERT ... ON DUPLICATE KEY UPDATE under the row lock, on the latest
--     committed version: the first assignment sets token to the new one only
--     if the row is claimable (and its token smaller: strictly increasing
--     per key even when a draw stalled), every later assignment keys on
--     token = v_tok, so the row is taken over whole or not at all.
--  3. read the row back; claimed is token = v_tok (a drawn token is never
--     stored anywhere else).
--
-- A race between 1 and 3 (the row changed in between) can return a row that
-- is claimable but not claimed, or none at all; the store then calls again.
--
-- p_offset shifts the clock (tests only; 0 in production).
CREATE PROCEDURE {{.ClaimProc}}(
    IN p_scope       VARBINARY(1024),
    IN p_key         VARBINARY(1024),
    IN p_method      VARBINARY(64),
    IN p_route       VARBINARY(2048),
    IN p_fingerprint VARBINARY(128),
    IN p_lease       BIGINT,
    IN p_retention   BIGINT,
    IN p_offset      BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
  DECLARE v_now  DATETIME(6) DEFAULT UTC_TIMESTAMP(6) + INTERVAL p_offset MICROSECOND;
  DECLARE v_tok  BIGINT DEFAULT NULL;
  DECLARE v_hold INT DEFAULT 0;

  SELECT COUNT(*) INTO v_hold FROM {{.Table}} r
  WHERE r.scope = p_scope AND r.`key` = p_key
    AND NOT ((r.expires_at <= v_now AND NOT (r.status = 'processing' AND r.locked_until > v_now))
          OR (r.method = p_method AND r.route = p_route AND r.fingerprint = p_fingerprint
              AND (r.status = 'failed' OR (r.status = 'processing' AND r.locked_until <= v_now))));

  IF v_hold = 0 THEN
    INSERT INTO {{.Tokens}} () VALUES ();
    SET v_tok = LAST_INSERT_ID();
    INSERT INTO {{.Table}} (scope, `key`, method, route, fingerprint, status, token,
                            locked_until, created_at, expires_at)
    VALUES (p_scope, p_key, p_method, p_route, p_fingerprint, 'processing', v_tok,
            v_now + INTERVAL p_lease MICROSECOND, v_now, v_now + INTERVAL p_retention MICROSECOND)
    ON DUPLICATE KEY UPDATE
      token = IF(token < v_tok AND (
                   (expires_at <= v_now AND NOT (status = 'processing' AND locked_until > v_now))
                   OR (method = p_method AND route = p_route AND fingerprint = p_fingerprint
                       AND (status = 'failed' OR (status = 'processing' AND locked_until <= v_now)))),
                 v_tok, token),
      -- Before expires_at, status and locked_until change: a record past
      -- retention is new again (created now); a takeover keeps its age.
      created_at = IF(token = v_tok AND expires_at <= v_now
                      AND NOT (status = 'processing' AND locked_until > v_now), v_now, created_at),
      method            = IF(token = v_tok, p_method, method),
      route             = IF(token = v_tok, p_route, route),
      fingerprint       = IF(token = v_tok, p_fingerprint, fingerprint),
      status            = IF(token = v_tok, 'processing', status),
      locked_until      = IF(token = v_tok, v_now + INTERVAL p_lease MICROSECOND, locked_until),
      expires_at        = IF(token = v_tok, v_now + INTERVAL p_retention MICROSECOND, expires_at),
      completed_at      = IF(token = v_tok, NULL, completed_at),
      resp_status       = IF(token = v_tok, NULL, resp_status),
      resp_header       = IF(token = v_tok, NULL, resp_header),
      resp_body         = IF(token = v_tok, NULL, resp_body),
      resp_not_retained = IF(token = v_tok, FALSE, resp_not_retained);
  END IF;

  SELECT method, route, fingerprint, status, token,
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', locked_until),
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at),
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at),
         resp_status, resp_header, resp_body, resp_not_retained,
         v_tok IS NOT NULL AND token = v_tok,
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', v_now)
  FROM {{.Table}} WHERE scope = p_scope AND `key` = p_key;
END
