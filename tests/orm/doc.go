// Package orm tests that handlers written with an ORM — GORM, sqlx, ent,
// bun — join idem's transaction on every store of record: the business
// row commits with the stored response or not at all, and a handler that
// ends the transaction itself (the ORM's Commit or Rollback, COMMIT or
// ROLLBACK sent as SQL) never leaves a stored 2xx without its row, nor a
// committed row that a retry books again. The handlers get the
// transaction from pgstore.SQLTx (PostgreSQL), mysqlstore.Tx
// (MySQL/MariaDB) and sqlitestore.Tx (SQLite). Its examples show the line
// that hands the transaction to each ORM.
//
// The ORMs are requirements of the tests module only: neither the root
// module nor any store module depends on them.
package orm
