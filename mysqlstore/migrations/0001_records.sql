-- idem records: one row per (scope, key), pruned by Sweep.
--
-- Every column the store compares is binary (VARBINARY, or an ENUM it
-- writes itself): MySQL's and MariaDB's text collations are case-insensitive
-- and PAD SPACE ('Key' = 'key '), which would merge two clients' keys.
-- VARBINARY compares byte for byte, trailing spaces included, and holds any
-- bytes (a scope need not be valid UTF-8). Times are DATETIME(6) holding UTC
-- (UTC_TIMESTAMP(6), never the session time zone): DATETIME does not convert
-- and does not end in 2038 as TIMESTAMP does.
--
-- Statements are separated by lines holding only ";;" (the driver runs one
-- statement at a time). MySQL 8.0+ and MariaDB 10.6+.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    scope             VARBINARY(1024) NOT NULL,
    `key`             VARBINARY(1024) NOT NULL,
    method            VARBINARY(64)   NOT NULL,
    route             VARBINARY(2048) NOT NULL,
    fingerprint       VARBINARY(128)  NOT NULL,
    status            ENUM('processing', 'completed', 'failed') NOT NULL,
    token             BIGINT          NOT NULL,
    locked_until      DATETIME(6)     NOT NULL,
    created_at        DATETIME(6)     NOT NULL,
    expires_at        DATETIME(6)     NOT NULL,
    completed_at      DATETIME(6)     NULL,
    resp_status       SMALLINT        NULL,
    resp_header       MEDIUMBLOB      NULL,
    resp_body         LONGBLOB        NULL,
    resp_not_retained BOOLEAN         NOT NULL DEFAULT FALSE,
    PRIMARY KEY (scope, `key`),
    KEY {{.ExpiresIdx}} (expires_at)
) ENGINE = InnoDB
;;
-- Lease tokens: one row per draw, AUTO_INCREMENT. InnoDB persists the
-- counter (MySQL 8.0+, MariaDB 10.2.4+), so tokens are never reused even
-- after Sweep deletes old rows here or every record is gone. Never TRUNCATE
-- this table: that resets the counter. On Galera, wsrep_auto_increment_control
-- interleaves the nodes' values, so draws on different nodes never collide.
CREATE TABLE IF NOT EXISTS {{.Tokens}} (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE = InnoDB
