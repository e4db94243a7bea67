package chaos

import (
	"testing"
)

// TestChaos runs the chaos test on PostgreSQL (IDEM_TEST_PG_DSN): the
// database fault is pg_terminate_backend.
func TestChaos(t *testing.T) {
	Run(t, LoadConfig(t, 3000), NewPostgres(t))
}

// TestChaosMySQL runs it on MariaDB/MySQL (IDEM_TEST_MYSQL_DSN): the
// database fault is KILL CONNECTION.
func TestChaosMySQL(t *testing.T) {
	Run(t, LoadConfig(t, 3000), NewMySQL(t, "MariaDB", [2]string{"", ""}))
}

// TestChaosSQLite runs it with both instances on one SQLite file
// (sqlitestore); there are no database connections to kill, so the faults
// are the instance's SIGKILLs (three, at 15, 40 and 65 % of the keys).
func TestChaosSQLite(t *testing.T) {
	Run(t, LoadConfig(t, 1200), NewSQLite(t))
}
