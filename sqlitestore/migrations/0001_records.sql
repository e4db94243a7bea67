-- idem records: one row per (scope, key), pruned by Sweep.
--
-- Every column the store compares is a BLOB: SQLite compares BLOBs with
-- memcmp, byte for byte (trailing spaces, case, invalid UTF-8 and NUL
-- included). Instants are INTEGER microseconds since the Unix epoch read
-- from SQLite's clock (unixepoch('subsec'), millisecond resolution), never
-- from the caller's. Statements are separated by lines holding only ";;".
CREATE TABLE IF NOT EXISTS {{.Table}} (
    scope             BLOB    NOT NULL,
    key               BLOB    NOT NULL,
    method            BLOB    NOT NULL,
    route             BLOB    NOT NULL,
    fingerprint       BLOB    NOT NULL,
    status            TEXT    NOT NULL CHECK (status IN ('processing', 'completed', 'failed')),
    token             INTEGER NOT NULL,
    locked_until      INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    expires_at        INTEGER NOT NULL,
    completed_at      INTEGER NULL,
    resp_status       INTEGER NULL,
    resp_header       BLOB    NULL,
    resp_body         BLOB    NULL,
    resp_not_retained INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID
;;
CREATE INDEX IF NOT EXISTS {{.ExpiresIdx}} ON {{.Table}} (expires_at)
;;
-- Lease tokens: one counter row, bumped inside each claim's write
-- transaction. Sweep never touches it, so a token is never handed out
-- twice, even after every record is gone.
CREATE TABLE IF NOT EXISTS {{.Tokens}} (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
)
;;
INSERT OR IGNORE INTO {{.Tokens}} (id, last) VALUES (1, 0)
;;
-- Steps (core.StepStore): one row per recovery point. born is the
-- created_at of the record incarnation that saved it: a row born for an
-- earlier incarnation (the key expired and was claimed anew) is ignored.
-- A takeover keeps created_at, so the new owner reads its predecessor's
-- steps.
CREATE TABLE IF NOT EXISTS {{.Steps}} (
    scope  BLOB    NOT NULL,
    key    BLOB    NOT NULL,
    name   BLOB    NOT NULL,
    born   INTEGER NOT NULL,
    result BLOB    NOT NULL,
    PRIMARY KEY (scope, key, name)
) WITHOUT ROWID
;;
-- A completed record cannot be taken over: nobody reads its steps again.
-- (Claim upserts, so a takeover fires no DELETE.)
CREATE TRIGGER IF NOT EXISTS {{.TrgComplete}} AFTER UPDATE OF status ON {{.Table}}
WHEN NEW.status = 'completed'
BEGIN
    DELETE FROM {{.Steps}} WHERE scope = NEW.scope AND key = NEW.key;
END
;;
CREATE TRIGGER IF NOT EXISTS {{.TrgDelete}} AFTER DELETE ON {{.Table}}
BEGIN
    DELETE FROM {{.Steps}} WHERE scope = OLD.scope AND key = OLD.key;
END
;;
-- Commit marks of the lease transaction (sqlitestore.Tx). Tx inserts the
-- row of its lease token as the transaction's first statement, so it
-- commits exactly when the handler's writes do; when the handler ended
-- the transaction itself, the mark tells whether they committed. On the
-- usual path it is deleted in the transaction before the commit.
CREATE TABLE IF NOT EXISTS {{.TxMarks}} (
    token      INTEGER PRIMARY KEY,
    created_at INTEGER NOT NULL
)
