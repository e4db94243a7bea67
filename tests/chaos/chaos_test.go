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
