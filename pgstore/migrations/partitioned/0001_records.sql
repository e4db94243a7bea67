-- idem records, partitioned retention mode.
--
-- Ownership (the part that must be unique per (scope, key)) lives in a
-- small unpartitioned table; response payloads live in a table range
-- partitioned by the day they were stored, dropped whole by Maintain.
-- PostgreSQL cannot enforce PRIMARY KEY (scope, key) on a range-partitioned
-- table without the partition column, so uniqueness is enforced where it can
-- be: on the claim table.

-- Lease tokens. CACHE 1 (the default) is required: with a per-session
-- cache, tokens would not be increasing across connections.
CREATE SEQUENCE IF NOT EXISTS {{.Seq}} AS bigint START WITH 1 CACHE 1 NO CYCLE;

CREATE TABLE IF NOT EXISTS {{.Table}} (
    scope        text        NOT NULL,
    key          text        NOT NULL,
    method       text        NOT NULL,
    route        text        NOT NULL,
    fingerprint  text        NOT NULL,
    status       text        NOT NULL CHECK (status IN ('processing', 'completed', 'failed')),
    token        bigint      NOT NULL,
    locked_until timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    -- completed_at is the payload's partition key: it lets the payload
    -- lookup prune to one partition.
    completed_at timestamptz,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 90);

CREATE INDEX IF NOT EXISTS {{.ExpiresIdx}} ON {{.Table}} (expires_at);

CREATE TABLE IF NOT EXISTS {{.Payload}} (
    scope             text        NOT NULL,
    key               text        NOT NULL,
    token             bigint      NOT NULL,
    stored_at         timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL,
    resp_status       integer     NOT NULL,
    resp_header       jsonb,
    resp_body         bytea,
    resp_not_retained boolean     NOT NULL,
    PRIMARY KEY (scope, key, token, stored_at)
) PARTITION BY RANGE (stored_at);

-- Lets Maintain prove a whole partition is past retention with one index probe.
CREATE INDEX IF NOT EXISTS {{.PayloadIdx}} ON {{.Payload}} (expires_at);

-- Safety net: if maintenance stops for longer than the days created ahead,
-- completes still succeed (their payloads land here) instead of failing
-- with "no partition of relation found for row". Maintain moves such rows
-- into a proper partition when it creates one.
CREATE TABLE IF NOT EXISTS {{.PayloadDefault}} PARTITION OF {{.Payload}} DEFAULT;
