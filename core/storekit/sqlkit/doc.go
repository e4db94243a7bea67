// Package sqlkit is for authors of SQL stores: the code idem's own SQL
// stores share, public so that each of them (its own module) builds
// against it as against any other package of the root module. mysqlstore
// and sqlitestore (database/sql) use all of it; pgstore (pgx) uses the
// claim rule, the identifier check and the migration loader. A store
// author may use it too; core/storetest is still the judge of a store.
//
// What is here:
//
//   - Claimable, the claim rule of core.Store in Go, for stores that
//     re-check their claim statement's answer;
//   - ValidIdent, the rule for table and schema names;
//   - LoadMigrations and Statements, embedded versioned migrations;
//   - AppendHeader, the binary format of stored response headers;
//   - for database/sql stores: Config (the options they take alike),
//     ValidClaim and the column limits behind it, ScanRecord, ScanStuck,
//     ResponseBlobs and NullTime (the record columns), StmtCache (prepared
//     statements), and LeaseState with StateOf, Granted, Owned and Abandon
//     (a lease's transaction and deferred statements).
//
// Why a public package: the stores are modules of their own, and a module
// must not import another module's internal/ (Go's rule goes by path and
// would allow it, but internal/ promises nothing, and a user's build may
// pair an older store with a newer root module). A copy in each store's own
// internal/ would drift; one public package is versioned, documented and
// tested once. What every transactional store must do is likewise written
// once, in core/storetest/txtest, which each store runs with a harness.
//
// What it promises: it imports only the standard library, core and
// core/storekit, and core never imports it. Its Go API follows the v0
// rules of every idem package (see the README's "Stability and
// versioning"). What it writes to a database does not change within a
// version: the header format starts with a version byte, and a release
// reads every version an earlier one wrote.
package sqlkit
