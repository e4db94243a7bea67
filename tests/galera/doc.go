// Package galera holds idem's tests against a MariaDB Galera cluster
// (synchronous multi-primary replication): mysqlstore on three nodes at
// once, and the examples/payments chaos run with its two instances on two
// different nodes.
//
// The cluster comes from the environment or is started for the run:
//
//   - IDEM_TEST_GALERA_DSNS set (three go-sql-driver DSNs, comma-separated,
//     one per node): the tests use that cluster. `make test-galera` runs
//     scripts/galera.sh, which starts a throw-away three-node cluster on
//     loopback, sets the variable, runs this package and removes the
//     cluster.
//   - unset (as in `make test` / `go test ./...`): TestMain starts the same
//     throw-away cluster through `scripts/galera.sh serve` and stops it when
//     the tests end (also when the test binary dies: the script watches its
//     stdin). A machine without MariaDB's Galera packages fails the run with
//     the command that installs them; the tests never skip.
package galera
