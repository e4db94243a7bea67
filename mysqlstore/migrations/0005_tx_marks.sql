-- Commit marks of the lease transaction (mysqlstore.Tx). Tx inserts the
-- row of its lease token as the transaction's first statement, so the row
-- is committed exactly when the handler's writes are. database/sql's
-- *sql.Tx cannot refuse the handler's own Commit or Rollback: when the
-- handler ended the transaction before Complete, the mark tells which it
-- was. Present: the writes committed, the response may be recorded.
-- Absent: they rolled back; the response is refused and the key released.
--
-- On the usual path (idem commits) the row is deleted in the transaction
-- before the commit: it never lands. A row left behind (a handler that
-- committed itself and a process that died before Complete) is deleted by
-- Sweep after a day. One small row per token, no secondary index: its own
-- table, not a column of the record, so that concurrent duplicates are not
-- blocked by the transaction's row lock on the record and, on Galera,
-- writes to the record from another node do not conflict with it in
-- certification.
CREATE TABLE IF NOT EXISTS {{.TxMarks}} (
    token      BIGINT      NOT NULL PRIMARY KEY,
    created_at DATETIME(6) NOT NULL
) ENGINE = InnoDB
