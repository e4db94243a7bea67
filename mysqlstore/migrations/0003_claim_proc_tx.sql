-- The claim procedure again (see 0002 for how it works), with the token
-- draw and the upsert in one transaction: one commit per claim that writes
-- instead of two (each autocommit statement is its own commit and, with
-- innodb_flush_log_at_trx_commit=1, its own log flush; on Galera its own
-- write set). A draw rolled back with a failed upsert leaves a gap in the
-- tokens, never a reuse: AUTO_INCREMENT does not hand a value out twice.
--
-- 0002's procedure stays: a binary of the previous version still calls it
-- during a rolling deploy.
CREATE PROCEDURE {{.ClaimProcV2}}(
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
  -- Any error inside the transaction (a deadlock, a Galera certification
  -- conflict) ends it before the error reaches the caller: the pooled
  -- connection never keeps an open transaction.
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    ROLLBACK;
    RESIGNAL;
  END;

  SELECT COUNT(*) INTO v_hold FROM {{.Table}} r
  WHERE r.scope = p_scope AND r.`key` = p_key
    AND NOT ((r.expires_at <= v_now AND NOT (r.status = 'processing' AND r.locked_until > v_now))
          OR (r.method = p_method AND r.route = p_route AND r.fingerprint = p_fingerprint
              AND (r.status = 'failed' OR (r.status = 'processing' AND r.locked_until <= v_now))));

  IF v_hold = 0 THEN
    START TRANSACTION;
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
    COMMIT;
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
