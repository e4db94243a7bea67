package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// mysqlBackend is a fresh database on a MariaDB/MySQL server, or on a
// Galera cluster seen through several nodes, and a user of its own for the
// run: the instances connect as that user, so their connections are told
// from every other thread by the user alone. Galera's appliers and
// aborters ("system user"), the event scheduler, the test's own admin
// connections (the DSN's user) and other tests' connections are never
// candidates for Fault.
type mysqlBackend struct {
	name   string
	db     string
	user   string    // the instances' user, created for the run
	admins []*sql.DB // one per server the instances use; admins[0] reads the results
	dsns   [2]string
	// readPrefix makes the final reads causal on Galera.
	readPrefix string
}

// Victim is one connection Fault may kill.
type Victim struct {
	Server         int // index in the servers given to NewMySQL, first one first (one per address)
	ID             int64
	User, Host     string
	Command, State string
}

// victimsQuery selects the instances' connections on one server: by the
// run's user (a client thread, never a system one: those run as
// "system user" or "event_scheduler", with no host), in the run's database,
// over the network, not the querying connection itself.
const victimsQuery = `SELECT id, user, host, command, COALESCE(state, '') FROM information_schema.PROCESSLIST
WHERE user = ? AND db = ? AND host <> '' AND id <> CONNECTION_ID()`

// NewMySQL creates a fresh database for a run on the server named by
// servers[i] for instance i (go-sql-driver DSNs; "" is the test server,
// IDEM_TEST_MYSQL_DSN), and a user with every privilege on it (and none
// elsewhere) for the instances. On a Galera cluster, name two nodes: the
// database and the user are created through the first and replicate to
// the others; the results are read through the first, causally. The
// database and the user are dropped when the test ends.
func NewMySQL(t *testing.T, name string, servers [2]string) Backend {
	t.Helper()
	m := &mysqlBackend{name: name}
	fresh := mysqlstoretest.Database(t, servers[0])
	m.db = fresh.DBName
	m.user = "idemchaos_" + RandomHex(8)
	password := RandomHex(16)
	seen := map[string]bool{}
	for i, server := range servers {
		cfg := mysqlstoretest.Config(t, server)
		if !seen[cfg.Addr] {
			seen[cfg.Addr] = true
			admin := mysqlstoretest.Open(t, cfg)
			admin.SetMaxOpenConns(2)
			m.admins = append(m.admins, admin)
		}
		u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + m.db, User: url.UserPassword(m.user, password)}
		m.dsns[i] = u.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// On a Galera node, read causally: wait for the cluster's earlier
	// commits (made through the other node) first.
	var vname, value string
	err := m.admins[0].QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&vname, &value)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("detect galera: %v", err)
	}
	if value == "ON" {
		m.readPrefix = "SET STATEMENT wsrep_sync_wait = 1 FOR "
	}
	// The names are ours (hex), the password too: no quoting issue.
	if _, err := m.admins[0].ExecContext(ctx, "CREATE USER '"+m.user+"'@'%' IDENTIFIED BY '"+password+"'"); err != nil {
		t.Fatalf("create the instances' user: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := m.admins[0].ExecContext(ctx, "DROP USER IF EXISTS '"+m.user+"'@'%'"); err != nil {
			t.Errorf("drop the instances' user: %v", err)
		}
	})
	if _, err := m.admins[0].ExecContext(ctx, "GRANT ALL PRIVILEGES ON `"+m.db+"`.* TO '"+m.user+"'@'%'"); err != nil {
		t.Fatalf("grant the instances' user: %v", err)
	}
	// Every server knows the user before an instance connects through it.
	for i, admin := range m.admins {
		var n int
		if err := admin.QueryRowContext(ctx, m.readPrefix+"SELECT COUNT(*) FROM mysql.user WHERE user = ?", m.user).Scan(&n); err != nil || n != 1 {
			t.Fatalf("server %d: the instances' user: %d rows, %v", i+1, n, err)
		}
	}
	return m
}

func (m *mysqlBackend) Name() string     { return m.name }
func (m *mysqlBackend) DSN(i int) string { return m.dsns[i] }

// Victims lists the connections Fault may kill, on every server the
// instances use (victimsQuery).
func (m *mysqlBackend) Victims(ctx context.Context) ([]Victim, error) {
	var out []Victim
	for i, admin := range m.admins {
		vs, err := m.victims(ctx, admin)
		if err != nil {
			return nil, err
		}
		for _, v := range vs {
			v.Server = i
			out = append(out, v)
		}
	}
	return out, nil
}

func (m *mysqlBackend) victims(ctx context.Context, admin *sql.DB) ([]Victim, error) {
	rows, err := admin.QueryContext(ctx, victimsQuery, m.user, m.db)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Victim
	for rows.Next() {
		var v Victim
		if err := rows.Scan(&v.ID, &v.User, &v.Host, &v.Command, &v.State); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Fault kills one connection, at random, of those the instances hold on a
// randomly chosen server.
func (m *mysqlBackend) Fault(ctx context.Context) (int, error) {
	admin := m.admins[rand.IntN(len(m.admins))]
	vs, err := m.victims(ctx, admin)
	if err != nil || len(vs) == 0 {
		return 0, err
	}
	id := vs[rand.IntN(len(vs))].ID
	if _, err := admin.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) {
			switch me.Number {
			case 1094: // ER_NO_SUCH_THREAD: it just closed
				return 0, nil
			case 1095:
				// ER_KILL_DENIED_ERROR, as root: on Galera, "a high priority
				// thread/query". An instance's own connection is one while
				// it runs DDL in total order isolation (Migrate at each
				// restart) or replays a transaction a replicated one
				// aborted; killing it would compromise the cluster, so the
				// server refuses. Not a failure: no kill this time.
				return 0, nil
			}
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
