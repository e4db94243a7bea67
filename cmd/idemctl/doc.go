// Command idemctl is the operator's tool for idem's stores: look at one
// record, list keys stuck past their lease, release one so a retry runs at
// once, run retention, and count records by status and age.
//
//	idemctl inspect -scope u1 [-body] [-show-key] KEY   one record, steps of a processing one (KEY "-": stdin)
//	idemctl stuck [-limit 100] [-show-keys]             processing past the lease, longest lapsed first
//	idemctl release -scope u1 [-token N] [-live] KEY     mark a stuck record failed (fenced by its token)
//	idemctl complete -url URL [-after 0] [-max-age 23h]  finish stalled executions through the service
//	idemctl sweep [-batch 1000] [-margin 1h]             delete expired records until none is left
//	idemctl maintain [-margin 1h]                        all retention work of the store's mode
//	idemctl stats                                        counts by status and age
//	idemctl schema postgres|mysql [-schema s] [-table t] the store's schema as plain SQL, for goose, Flyway, Atlas
//	idemctl version [-json]                              the module version it was built from
//
// Every command that reads a store takes -dsn (default $DATABASE_URL): a
// PostgreSQL URL or key=value string selects pgstore, a
// mysql://user:pass@host:port/db URL mysqlstore (the form
// examples/payments takes); -mysql takes a go-sql-driver DSN
// (user:pass@tcp(host:port)/db) instead, and -sqlite the path of an
// existing SQLite database file (sqlitestore). Also -schema (PostgreSQL) and
// -table (WithSchema/WithTable; pgstore's retention mode is read from its
// migrations table), and -json for scripts. Flags may come before or after
// the key.
//
// schema needs no database: it prints what the store's Migrate would
// create on an empty one (pgstore.SchemaSQL, mysqlstore.SchemaSQL), with
// the rows that record those migrations as applied, so Migrate and New
// accept a schema created by another tool.
//
// Keys are capabilities: idemctl never prints one in clear (nor a key given
// on the command line in an error) unless -show-key/-show-keys asks; it
// shows core.RedactKey's short hash instead, the form idem's logs use.
// Response bodies are shown only with -body.
//
// Release is fenced like an owner's write: it changes the record only if it
// is still processing under the token read (or given with -token), so it
// cannot release a request that took the key over since; and the owner it
// releases, if it was alive after all, gets "lease lost" on its commit (in
// pgstore's transactional mode its business writes roll back). A record
// whose lease is still running is refused unless -live says its owner is
// known dead.
//
// Exit codes (also in idemctl -h): 0 success; 1 failure (database
// unreachable, query failed); 2 usage; 3 record not found; 4 release
// refused (lease live, or the record changed owner or state); 5 stuck
// -fail found a record stuck past its lease (for cron and alerting:
// `idemctl stuck -fail > /dev/null || page-someone`).
package main
