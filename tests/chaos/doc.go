// Package chaos holds idem's chaos test (Run, chaos.go): two instances of
// the examples/payments binary share one database (a PostgreSQL schema, a
// MariaDB/MySQL database, or one database on two nodes of a Galera
// cluster: see Backend) and an external fake payment provider while a
// driver sends thousands of requests, a third of them concurrent
// duplicates, one instance is SIGKILLed and restarted over and over, and
// random database connections of the instances are killed
// (pg_terminate_backend, KILL CONNECTION). At the end
// every key that got a 201 must have exactly one ledger row and one
// provider charge, replay byte-identically, and no record may be stuck in
// processing past its lease.
//
// TestChaos (PostgreSQL), TestChaosMySQL (MariaDB) and TestChaosSQLite (two
// instances on one SQLite file, 1200 requests) run in
// `go test ./...` with a CI-sized request count; tests/galera runs Run
// on a Galera cluster. `make chaos` runs the full size:
//
//	IDEM_CHAOS_REQUESTS=10000 go test -count=1 -timeout 20m -run TestChaos -v ./tests/chaos
//
// Environment: IDEM_TEST_PG_DSN (see pgstore/pgstoretest), IDEM_TEST_MYSQL_DSN
// (see mysqlstore/mysqlstoretest), IDEM_CHAOS_REQUESTS
// (default 3000, 600 with -short), IDEM_CHAOS_FRAMEWORKS (the two
// instances' -framework values, default "nethttp,nethttp"),
// IDEM_CHAOS_RACE=1 (build the example with -race).
package chaos
