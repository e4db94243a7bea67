-- The claim's slow path as its own function, so the fast path can run as
-- plain SQL in the claim statement itself (sql.go, buildStatements):
--
--   WITH f AS (INSERT ... ON CONFLICT (scope, key) DO NOTHING RETURNING ...)
--   SELECT * FROM f
--   UNION ALL SELECT * FROM <table>_claim_slow(...) WHERE NOT EXISTS (SELECT 1 FROM f)
--
-- Still one statement and one round trip; the function runs only when the
-- key exists. Calling PL/pgSQL for every claim (migration 0002) cost ~12 %
-- of claim+complete throughput at 16 clients (BENCHMARKS.md §3).
--
-- The body is the claim-or-read statement (sql.go, claimFull), rendered
-- from the store's code when this migration is applied; changing that
-- statement needs a new migration. LANGUAGE sql, VOLATILE: the statement
-- takes its own snapshot (READ COMMITTED), after the fast path's insert hit
-- the existing row, exactly as the 0002 function's second statement did.
--
-- 0002's <table>_claim is kept: binaries of the previous version still call
-- it during a rolling deploy.
CREATE OR REPLACE FUNCTION {{.ClaimSlowFn}}(
    p_scope text, p_key text, p_method text, p_route text, p_fingerprint text,
    p_lease bigint, p_retention bigint, p_now timestamptz)
RETURNS TABLE (
    o_scope text, o_key text, o_method text, o_route text, o_fingerprint text,
    o_status text, o_token bigint, o_locked_until timestamptz,
    o_created_at timestamptz, o_expires_at timestamptz,
    o_resp_status integer, o_resp_header jsonb, o_resp_body bytea,
    o_resp_not_retained boolean, o_has_payload boolean,
    o_claimed boolean, o_now timestamptz)
LANGUAGE sql VOLATILE AS $idem$
{{.ClaimFull}}
$idem$;
