-- The claim of a new key in its cheap form, tried first while most claims
-- are of new keys (Store.Claim decides: storekit.ClaimMix). The claim
-- procedure (0006) reads the key, upserts it with a dozen conditional
-- assignments and reads it back, all interpreted; for a key that does not
-- exist this draws a token and inserts the processing record, in one
-- transaction, and reads nothing: about a third of the server's CPU.
--
-- One row (the token and the procedure's clock) when it created the
-- record: the caller knows everything else it wrote. No row when the key
-- exists (a duplicate key, whatever the record's state, expired included):
-- the transaction rolls back, token and all, and the caller claims through
-- the claim procedure as before. Any other error ends the transaction and
-- reaches the caller (a Galera certification conflict, 1213, is retried
-- by the caller: the retry finds the key if the other node's insert won).
-- A plain INSERT, not INSERT IGNORE: IGNORE would turn other errors into
-- warnings.
CREATE PROCEDURE {{.ClaimNewProc}}(
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
  DECLARE v_now    DATETIME(6) DEFAULT UTC_TIMESTAMP(6) + INTERVAL p_offset MICROSECOND;
  DECLARE v_tok    BIGINT;
  DECLARE v_exists INT DEFAULT 0;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    ROLLBACK;
    RESIGNAL;
  END;

  START TRANSACTION;
  INSERT INTO {{.Tokens}} () VALUES ();
  SET v_tok = LAST_INSERT_ID();
  BEGIN
    DECLARE CONTINUE HANDLER FOR 1062 SET v_exists = 1; -- ER_DUP_ENTRY: the key exists
    INSERT INTO {{.Table}} (scope, `key`, method, route, fingerprint, status, token,
                            locked_until, created_at, expires_at)
    VALUES (p_scope, p_key, p_method, p_route, p_fingerprint, 'processing', v_tok,
            v_now + INTERVAL p_lease MICROSECOND, v_now, v_now + INTERVAL p_retention MICROSECOND);
  END;
  IF v_exists = 1 THEN
    ROLLBACK;
  ELSE
    COMMIT;
    SELECT v_tok, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', v_now);
  END IF;
END
