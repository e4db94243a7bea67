-- Recovery points (core.StepStore, step.go): the stored results of a
-- handler's steps, one row per (scope, key, step name).
--
-- epoch is the record's created_at when the step was stored. A takeover
-- keeps created_at, so the steps survive it; a key that is new again after
-- retention gets a new created_at, so the old incarnation's steps no longer
-- match (and a step of the same name replaces its row).
--
-- The foreign key deletes a record's steps with it (Sweep, or an operator's
-- DELETE): no separate sweep. It costs the records table nothing on the
-- hot path: scope and key are never updated, so PostgreSQL queues no
-- referential check for a claim, heartbeat or complete. scope leads the
-- primary key, as in the records table (distribution by scope).
CREATE TABLE IF NOT EXISTS {{.Steps}} (
    scope     text        NOT NULL,
    key       text        NOT NULL,
    name      text        NOT NULL,
    epoch     timestamptz NOT NULL,
    token     bigint      NOT NULL,
    result    bytea       NOT NULL,
    stored_at timestamptz NOT NULL,
    PRIMARY KEY (scope, key, name),
    FOREIGN KEY (scope, key) REFERENCES {{.Table}} (scope, key) ON DELETE CASCADE
);
