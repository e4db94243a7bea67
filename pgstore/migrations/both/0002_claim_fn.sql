-- The claim as one function call (one round trip, as before): a plain
-- INSERT ... ON CONFLICT DO NOTHING first, which is all a new key needs;
-- only when the key exists, the full claim-or-read statement (sql.go,
-- claimFull), run unchanged with its own snapshot. A conflict on the fast
-- path draws a token that is never used: tokens stay unique and increasing
-- per key, not dense. PL/pgSQL: PostgreSQL-only (see README).
--
-- The slow path's text is rendered from the store's code when this
-- migration is applied; changing that statement needs a new migration.
CREATE OR REPLACE FUNCTION {{.ClaimFn}}(
    p_scope text, p_key text, p_method text, p_route text, p_fingerprint text,
    p_lease bigint, p_retention bigint, p_now timestamptz)
RETURNS TABLE (
    o_scope text, o_key text, o_method text, o_route text, o_fingerprint text,
    o_status text, o_token bigint, o_locked_until timestamptz,
    o_created_at timestamptz, o_expires_at timestamptz,
    o_resp_status integer, o_resp_header jsonb, o_resp_body bytea,
    o_resp_not_retained boolean, o_has_payload boolean,
    o_claimed boolean, o_now timestamptz)
LANGUAGE plpgsql VOLATILE AS $idem$
BEGIN
  RETURN QUERY
  INSERT INTO {{.Table}} AS r (scope, key, method, route, fingerprint, status, token, locked_until, created_at, expires_at)
  VALUES (p_scope, p_key, p_method, p_route, p_fingerprint, 'processing', nextval('{{.Seq}}'::regclass),
          p_now + p_lease * interval '1 microsecond', p_now,
          p_now + p_retention * interval '1 microsecond')
  ON CONFLICT (scope, key) DO NOTHING
  RETURNING r.scope, r.key, r.method, r.route, r.fingerprint, r.status, r.token,
            r.locked_until, r.created_at, r.expires_at,
            NULL::integer, NULL::jsonb, NULL::bytea, false, false, true, p_now;
  IF FOUND THEN
    RETURN;
  END IF;
  RETURN QUERY
{{.ClaimFull}};
END
$idem$;
