#!/usr/bin/env bash
# pgfloor.sh: what PostgreSQL alone spends per first execution of each
# design of BENCHMARKS.md §3, with no Go in the way. pgbench replays the
# statements each server sends (same SQL shapes, same round trips: a
# pipeline is one round trip) against a scratch schema; the whole machine's
# CPU per transaction (PostgreSQL and pgbench) and the transactions per
# second are printed per flow. Bounded (SECS per flow, 16 clients), local,
# and the schema is dropped at the end.
#
#   scripts/pgfloor.sh [SECS]     (default 8; DSN from $IDEM_TEST_PG_DSN)
set -euo pipefail
secs=${1:-8}
dsn=${IDEM_TEST_PG_DSN:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
root=$(cd "$(dirname "$0")/.." && pwd)
schema=pgfloor_$$
dir=$(mktemp -d)
cleanup() { psql "$dsn" -qc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT

# The store's schema as pgstore.Migrate creates it, the example's ledger,
# and the article's table (examples/loadgen/article.go).
(cd "$root/cmd/idemctl" && go run . schema postgres -schema "$schema") > "$dir/schema.sql"
psql "$dsn" -q -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $schema" -f "$dir/schema.sql" >/dev/null 2>&1
psql "$dsn" -q -v ON_ERROR_STOP=1 >/dev/null <<EOF
CREATE TABLE $schema.payments (id text PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL CHECK (amount > 0),
  currency text NOT NULL, recipient text NOT NULL, provider_charge_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON $schema.payments (user_id, created_at, id);
CREATE TABLE $schema.idempotency_keys (idempotency_key VARCHAR(255) NOT NULL, user_id VARCHAR(64) NOT NULL,
  request_path VARCHAR(255) NOT NULL, request_hash CHAR(64) NOT NULL, status VARCHAR(32) NOT NULL, response_code INT,
  response_body JSONB, created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP, locked_until TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (user_id, idempotency_key));
CREATE INDEX ON $schema.idempotency_keys (created_at);
EOF

s=$schema
body='{"id":"pay_0123456789abcdef0123","amount":1000,"currency":"EUR","to":"acct_42","provider_charge_id":"ch_0123456789abcdef01234567"}'
key="'k' || :k"
user="'u' || :client_id"
fence="scope = $user AND key = $key AND token = :tok AND status = 'processing' AND (expires_at > now() OR locked_until > now())"
ledger="INSERT INTO $s.payments (id, user_id, amount, currency, recipient, provider_charge_id) VALUES ('p' || :k, $user, 1000, 'EUR', 'acct_42', 'ch_' || :k);"
# pgstore's claim function (during a retry storm) and its bare insert (while new keys dominate).
claimfn="SELECT ($s.idem_records_claim_row($user, $key, 'POST', '/v1/payments', 'fp' || :k, 30000000, 86400000000, now())).token AS tok \gset"
claimins="INSERT INTO $s.idem_records (scope, key, method, route, fingerprint, status, token, locked_until, created_at, expires_at) VALUES ($user, $key, 'POST', '/v1/payments', 'fp' || :k, 'processing', nextval('$s.idem_records_token_seq'::regclass), now() + 30000000::bigint * interval '1 microsecond', now(), now() + 86400000000::bigint * interval '1 microsecond') ON CONFLICT (scope, key) DO NOTHING RETURNING token AS tok \gset"
# The complete as sent inside a transaction (completeTx: raises when the fence fails).
complete="WITH c AS (UPDATE $s.idem_records SET status = 'completed', completed_at = now(), resp_status = 201, resp_header = '{\"Content-Type\":[\"application/json\"]}'::jsonb, resp_body = convert_to('$body', 'UTF8'), resp_not_retained = false WHERE $fence RETURNING waiters) SELECT CASE WHEN count(*) = 1 THEN bool_or(waiters) ELSE ('idem: lease lost ' || count(*))::boolean END FROM c;"
step="INSERT INTO $s.idem_records_steps (scope, key, name, epoch, token, result, stored_at) SELECT r.scope, r.key, 'provider-charge', r.created_at, r.token, convert_to('{\"id\":\"ch_0123456789abcdef01234567\"}', 'UTF8'), now() FROM (SELECT scope, key, token, created_at FROM $s.idem_records WHERE $fence FOR SHARE) r ON CONFLICT (scope, key, name) DO UPDATE SET epoch = excluded.epoch, token = excluded.token, result = excluded.result, stored_at = excluded.stored_at;"
rnd='\set k random(1, 9000000000000000000)'

declare -A trips
flow() { local name=$1 rt=$2; shift 2; trips[$name]=$rt; printf '%s\n' "$rnd" "$@" > "$dir/$name.sql"; }
flow bare 1 "$ledger"
flow article 3 \
  "INSERT INTO $s.idempotency_keys (idempotency_key, user_id, request_path, request_hash, status, locked_until, created_at, updated_at) VALUES ($key, $user, '/v1/payments', repeat('a', 64), 'PROCESSING', now() + interval '30 seconds', now(), now()) ON CONFLICT (user_id, idempotency_key) DO NOTHING;" \
  "$ledger" \
  "UPDATE $s.idempotency_keys SET status = 'SUCCEEDED', response_code = 201, response_body = '$body'::jsonb, updated_at = now() WHERE user_id = $user AND idempotency_key = $key;"
# Before issue 21's Defer: BEGIN rides with the ledger insert, the complete with COMMIT.
flow idem-tx 3 "$claimfn" '\startpipeline' 'BEGIN;' "$ledger" '\endpipeline' '\startpipeline' "$complete" 'COMMIT;' '\endpipeline'
# pgstore.Defer: the ledger insert and the complete in one pipeline, one implicit transaction.
flow idem-defer 2 "$claimfn" '\startpipeline' "$ledger" "$complete" '\endpipeline'
flow idem-defer-insertfirst 2 "$claimins" '\startpipeline' "$ledger" "$complete" '\endpipeline'
flow idem-step-defer-insertfirst 3 "$claimins" "$step" '\startpipeline' "$ledger" "$complete" '\endpipeline'

busy() { awk '/^cpu / {print $2+$3+$4+$7+$8}' /proc/stat; }
hz=$(getconf CLK_TCK)
printf '| flow | round trips | tps | machine CPU µs per transaction |\n|---|---:|---:|---:|\n'
for f in bare article idem-tx idem-defer idem-defer-insertfirst idem-step-defer-insertfirst; do
  b0=$(busy)
  out=$(pgbench "$dsn" -n -M prepared -c 16 -j 2 -T "$secs" -f "$dir/$f.sql" 2>&1) || { echo "$out" >&2; exit 1; }
  b1=$(busy)
  tx=$(awk '/number of transactions actually processed/ {split($NF, a, "/"); print a[1]}' <<<"$out")
  tps=$(awk '/^tps/ {printf "%d", $3}' <<<"$out")
  printf '| %s | %s | %s | %d |\n' "$f" "${trips[$f]}" "$tps" $(( (b1 - b0) * 1000000 / hz / tx ))
done
