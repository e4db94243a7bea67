package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/internal/mytest"
)

// mysqlBackend is a fresh database on a MariaDB/MySQL server, or on a
// Galera cluster seen through several nodes. The instances' connections are
// those whose current database is the fresh one (Galera's appliers, "system
// user", excepted); the test's own admin connections use another, so Fault
// never kills them.
type mysqlBackend struct {
	name   string
	db     string
	admins []*sql.DB // one per server the instances use; admins[0] reads the results
	dsns   [2]string
	// readPrefix makes the final reads causal on Galera.
	readPrefix string
}

// NewMySQL creates a fresh database for a run on the server named by
// servers[i] for instance i (go-sql-driver DSNs; "" is the test server,
// IDEM_TEST_MYSQL_DSN). On a Galera cluster, name two nodes: the database
// is created through the first and replicates to the others; the results
// are read through the first, causally. The database is dropped
// when the test ends.
func NewMySQL(t *testing.T, name string, servers [2]string) Backend {
	t.Helper()
	m := &mysqlBackend{name: name}
	fresh := mytest.Database(t, servers[0])
	m.db = fresh.DBName
	seen := map[string]bool{}
	for i, server := range servers {
		cfg := mytest.Config(t, server)
		if !seen[cfg.Addr] {
			seen[cfg.Addr] = true
			admin := mytest.Open(t, cfg)
			admin.SetMaxOpenConns(2)
			m.admins = append(m.admins, admin)
		}
		u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + m.db}
		if cfg.Passwd != "" {
			u.User = url.UserPassword(cfg.User, cfg.Passwd)
		} else {
			u.User = url.User(cfg.User)
		}
		m.dsns[i] = u.String()
	}
	// On a Galera node, read the results causally: wait for the cluster's
	// earlier commits (made through the other node) first.
	var vname, value string
	err := m.admins[0].QueryRowContext(context.Background(), "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&vname, &value)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("detect galera: %v", err)
	}
	if value == "ON" {
		m.readPrefix = "SET STATEMENT wsrep_sync_wait = 1 FOR "
	}
	return m
}

func (m *mysqlBackend) Name() string     { return m.name }
func (m *mysqlBackend) DSN(i int) string { return m.dsns[i] }

// Fault kills one connection, at random, of those the instances hold on a
// randomly chosen server.
func (m *mysqlBackend) Fault(ctx context.Context) (int, error) {
	admin := m.admins[rand.IntN(len(m.admins))]
	var id int64
	err := admin.QueryRowContext(ctx, `SELECT id FROM information_schema.PROCESSLIST
WHERE db = ? AND id <> CONNECTION_ID() AND user <> 'system user' ORDER BY RAND() LIMIT 1`, m.db).Scan(&id)
	if err == sql.ErrNoRows {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if _, err := admin.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1094 { // ER_NO_SUCH_THREAD: it just closed
			return 0, nil
		}
		return 0, err
	}
	return 1, nil
}

func (m *mysqlBackend) Ledger(ctx context.Context) (map[string]LedgerRow, int, error) {
	rows, err := m.admins[0].QueryContext(ctx, m.readPrefix+"SELECT id, user_id, provider_charge_id FROM `"+m.db+"`.`payments`")
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	ledger, n := map[string]LedgerRow{}, 0
	for rows.Next() {
		var id string
		var r LedgerRow
		if err := rows.Scan(&id, &r.User, &r.Charge); err != nil {
			return nil, 0, err
		}
		n++
		ledger[id] = r
	}
	return ledger, n, rows.Err()
}

func (m *mysqlBackend) Records(ctx context.Context) (processing, lapsed, failed int, err error) {
	err = m.admins[0].QueryRowContext(ctx, m.readPrefix+"SELECT COALESCE(SUM(status = 'processing'), 0), "+
		"COALESCE(SUM(status = 'processing' AND locked_until < UTC_TIMESTAMP(6)), 0), "+
		"COALESCE(SUM(status = 'failed'), 0) FROM `"+m.db+"`.`idem_records`").Scan(&processing, &lapsed, &failed)
	return processing, lapsed, failed, err
}
