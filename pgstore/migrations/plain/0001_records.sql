-- idem records, plain retention mode: one row per (scope, key), pruned by Sweep.

-- Lease tokens. CACHE 1 (the default) is required: with a per-session
-- cache, tokens would not be increasing across connections.
CREATE SEQUENCE IF NOT EXISTS {{.Seq}} AS bigint START WITH 1 CACHE 1 NO CYCLE;

CREATE TABLE IF NOT EXISTS {{.Table}} (
    scope             text        NOT NULL,
    key               text        NOT NULL,
    method            text        NOT NULL,
    route             text        NOT NULL,
    fingerprint       text        NOT NULL,
    status            text        NOT NULL CHECK (status IN ('processing', 'completed', 'failed')),
    token             bigint      NOT NULL,
    locked_until      timestamptz NOT NULL,
    created_at        timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL,
    completed_at      timestamptz,
    resp_status       integer,
    resp_header       jsonb,
    resp_body         bytea,
    resp_not_retained boolean     NOT NULL DEFAULT false,
    -- scope leads: the table can be distributed by scope (Citus) and every
    -- statement the store runs on it is single-row by (scope, key).
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 90); -- room for HOT updates (claims, heartbeats, completes)

CREATE INDEX IF NOT EXISTS {{.ExpiresIdx}} ON {{.Table}} (expires_at);
