-- The claim function of 0004, reading first: an existing record that is
-- not claimable (completed and unexpired, processing under a live lease,
-- failed with another request) is the answer, read with one index lookup
-- and returned as claimFull's CTE e would return it. A replay or an
-- in-flight duplicate thus no longer pays 0004's failed INSERT ... ON
-- CONFLICT DO NOTHING (with its nextval) and then the full claim-or-read
-- statement; a new key pays one index lookup more before its INSERT.
-- Same name, signature and result as 0004 (a binary of the previous
-- version calls it unchanged during a rolling deploy). PL/pgSQL:
-- PostgreSQL-only (see README).
--
-- Rendered from the store's code when applied (sql.go claimReadIntoSQL,
-- claimFull); changing those statements needs a new migration.
CREATE OR REPLACE FUNCTION {{.ClaimRowFn}}(
    p_scope text, p_key text, p_method text, p_route text, p_fingerprint text,
    p_lease bigint, p_retention bigint, p_now timestamptz)
RETURNS {{.ClaimRowType}}
LANGUAGE plpgsql VOLATILE AS $idem$
DECLARE
  o {{.ClaimRowType}};
BEGIN
{{.ClaimReadInto}};
  IF FOUND THEN
    RETURN o;
  END IF;
  INSERT INTO {{.Table}} AS r (scope, key, method, route, fingerprint, status, token, locked_until, created_at, expires_at)
  VALUES (p_scope, p_key, p_method, p_route, p_fingerprint, 'processing', nextval('{{.Seq}}'::regclass),
          p_now + p_lease * interval '1 microsecond', p_now,
          p_now + p_retention * interval '1 microsecond')
  ON CONFLICT (scope, key) DO NOTHING
  RETURNING r.token, r.locked_until, r.created_at, r.expires_at
  INTO o.token, o.locked_until, o.created_at, o.expires_at;
  IF FOUND THEN
    o.resp_not_retained := false;
    o.has_payload := false;
    o.claimed := true;
    o.now := p_now;
    RETURN o;
  END IF;
{{.ClaimFullInto}};
  RETURN o;
END
$idem$;
