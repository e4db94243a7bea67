-- The claim procedure again (see 0002 and 0003 for how it works), with
-- its answer read inside its transaction, before the COMMIT, when it
-- writes. 0003 read the record after its COMMIT: in between, an operator's
-- Release or a lapse and another request's takeover could change it, and
-- the claim answered "claimed" with a record already failed, or "not
-- claimed" after it had taken the key under a token it never reported (an
-- orphaned lease). The upsert holds the row's lock until the COMMIT, so the
-- row read under it (a locking read, at any isolation level) is the row as
-- committed. The answer is kept in variables and sent after the COMMIT, as
-- before: a COMMIT that fails (a Galera certification conflict, 1213)
-- still reaches the caller as an error with no result before it, and the
-- caller's retry reads the winner's record like any duplicate.
--
-- When the key is not claimable nothing is written and the answer is one
-- read, as before. Still one CALL and one result per claim.
--
-- A takeover of a lapsed lease also reads the commit mark of the token it
-- would take over from (mysqlstore.Tx, migration 0005): present, the
-- previous owner's handler committed the lease transaction itself and its
-- process died before Complete, so its writes are in the database. Taking
-- over would run them again; the record is completed as not retained
-- instead (a 500 nobody kept; retries answer 409 not-retained), as Fail
-- does when it finds the mark. The read locks (LOCK IN SHARE MODE): a
-- consistent read sees neither a mark still in flight (a handler past its
-- lease whose transaction is open) nor one committed after the read's
-- snapshot, and the takeover would run the committed writes again. Locking,
-- it reads the latest mark and waits for an open transaction's end, as a
-- pgstore takeover waits for the record's lock. Costs one primary-key read
-- on takeovers only.
--
-- 0002's and 0003's procedures stay: binaries of the previous versions
-- still call them during a rolling deploy.
CREATE PROCEDURE {{.ClaimProcV3}}(
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
  DECLARE v_prev BIGINT DEFAULT NULL; -- the lapsed lease a takeover would end
  DECLARE v_mark INT DEFAULT 0;
  DECLARE v_done INT DEFAULT 0;
  -- The answer read in the transaction (see above).
  DECLARE a_method      VARBINARY(64);
  DECLARE a_route       VARBINARY(2048);
  DECLARE a_fingerprint VARBINARY(128);
  DECLARE a_status      VARCHAR(16) CHARACTER SET ascii;
  DECLARE a_token       BIGINT;
  DECLARE a_locked      BIGINT;
  DECLARE a_created     BIGINT;
  DECLARE a_expires     BIGINT;
  DECLARE a_resp_status SMALLINT;
  DECLARE a_resp_header MEDIUMBLOB;
  DECLARE a_resp_body   LONGBLOB;
  DECLARE a_not_ret     BOOLEAN;
  -- Any error inside the transaction (a deadlock, a Galera certification
  -- conflict) ends it before the error reaches the caller: the pooled
  -- connection never keeps an open transaction.
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    ROLLBACK;
    RESIGNAL;
  END;

  SELECT COALESCE(SUM(NOT ((r.expires_at <= v_now AND NOT (r.status = 'processing' AND r.locked_until > v_now))
                 OR (r.method = p_method AND r.route = p_route AND r.fingerprint = p_fingerprint
                     AND (r.status = 'failed' OR (r.status = 'processing' AND r.locked_until <= v_now))))), 0),
         MAX(IF(r.status = 'processing' AND r.locked_until <= v_now AND r.expires_at > v_now
                AND r.method = p_method AND r.route = p_route AND r.fingerprint = p_fingerprint, r.token, NULL))
    INTO v_hold, v_prev
  FROM {{.Table}} r
  WHERE r.scope = p_scope AND r.`key` = p_key;

  IF v_hold = 0 THEN
    START TRANSACTION;
    IF v_prev IS NOT NULL THEN
      SELECT COUNT(*) INTO v_mark FROM {{.TxMarks}} WHERE token = v_prev LOCK IN SHARE MODE;
      -- The read may have waited for a handler's transaction: what follows
      -- decides on the row as it is now, so at the clock of now.
      SET v_now = UTC_TIMESTAMP(6) + INTERVAL p_offset MICROSECOND;
      IF v_mark > 0 THEN
        UPDATE {{.Table}}
        SET status = 'completed', completed_at = v_now, steps = NULL,
            resp_status = 500, resp_header = NULL, resp_body = '', resp_not_retained = TRUE
        WHERE scope = p_scope AND `key` = p_key AND token = v_prev AND status = 'processing'
          AND locked_until <= v_now AND expires_at > v_now;
        SET v_done = ROW_COUNT();
      END IF;
    END IF;
  END IF;

  IF v_hold = 0 AND v_done = 0 THEN
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

  IF v_hold = 0 THEN
    SELECT method, route, fingerprint, status, token,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', locked_until),
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at),
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at),
           resp_status, resp_header, resp_body, resp_not_retained
      INTO a_method, a_route, a_fingerprint, a_status, a_token,
           a_locked, a_created, a_expires,
           a_resp_status, a_resp_header, a_resp_body, a_not_ret
    FROM {{.Table}} WHERE scope = p_scope AND `key` = p_key
    FOR UPDATE;
    COMMIT;
    SELECT a_method, a_route, a_fingerprint, a_status, a_token,
           a_locked, a_created, a_expires,
           a_resp_status, a_resp_header, a_resp_body, a_not_ret,
           v_tok IS NOT NULL AND a_token = v_tok,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', v_now);
  ELSE
    SELECT method, route, fingerprint, status, token,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', locked_until),
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at),
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at),
           resp_status, resp_header, resp_body, resp_not_retained,
           FALSE,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', v_now)
    FROM {{.Table}} WHERE scope = p_scope AND `key` = p_key;
  END IF;
END
