// Package topology tests idem in the production set-ups the README names,
// each test starting (and removing) what it needs on loopback: PgBouncer in
// transaction pooling (TestPgBouncer, make test-pgbouncer) and a primary
// failing over to a streaming standby (TestFailover, make test-failover).
// They run only with IDEM_TEST_TOPOLOGY=1, which `make test` and their make targets set.
package topology
