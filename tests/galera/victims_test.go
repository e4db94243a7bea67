package galera

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
	"github.com/idemkit/idem/tests/chaos"
)

// TestFaultVictimsAreClientConnections: the connections the chaos test
// kills (TestPaymentsOnTwoNodes, chaos.mysqlBackend.Fault) are exactly the
// instances' own client connections, never Galera's system threads (its
// appliers, busy with the run's database here, answer KILL with error 1095
// and would fail the run). Six connections as the instances open them
// (their user, their DSNs) write to the run's database through two nodes,
// DDL included, so the appliers on each node apply that database's writes.
func TestFaultVictimsAreClientConnections(t *testing.T) {
	dsns := nodeDSNs(t)
	b := chaos.NewMySQL(t, "Galera", [2]string{dsns[0], dsns[1]})
	lister, ok := b.(interface {
		Victims(context.Context) ([]chaos.Victim, error)
	})
	if !ok {
		t.Fatalf("%T has no Victims method", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	own := map[[2]int64]bool{} // (server, connection id)
	var conns [2][]*sql.Conn
	for i := range 2 {
		cfg, err := mysqlstore.ParseURL(b.DSN(i))
		if err != nil {
			t.Fatal(err)
		}
		connector, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(connector)
		t.Cleanup(func() { _ = db.Close() })
		for range 3 {
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatalf("node %d as the instances' user: %v", i+1, err)
			}
			t.Cleanup(func() { _ = c.Close() })
			var id int64
			if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
				t.Fatal(err)
			}
			own[[2]int64{int64(i), id}] = true
			conns[i] = append(conns[i], c)
		}
	}
	if _, err := conns[0][0].ExecContext(ctx, "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := conns[1][0].ExecContext(ctx, "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*) FROM t"); err != nil {
		t.Fatal(err)
	}
	for n := range 50 {
		for i := range 2 {
			if _, err := conns[i][n%3].ExecContext(ctx, "INSERT INTO t (v) VALUES (?)", n); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The system threads are there, on both nodes, to be excluded.
	for i, dsn := range dsns[:2] {
		admin := mysqlstoretest.Open(t, mysqlstoretest.Config(t, dsn))
		var system int
		if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE user = 'system user'").Scan(&system); err != nil {
			t.Fatal(err)
		}
		if system == 0 {
			t.Errorf("node %d lists no 'system user' thread: nothing shows the selection excludes them", i+1)
		}
	}

	vs, err := lister.Victims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int64]bool{}
	for _, v := range vs {
		k := [2]int64{int64(v.Server), v.ID}
		seen[k] = true
		if !own[k] || v.User == "system user" || v.Host == "" {
			t.Errorf("candidate victim on node %d is not one of the instances' connections: %+v", v.Server+1, v)
		}
	}
	for k := range own {
		if !seen[k] {
			t.Errorf("the instances' connection %d on node %d is not a candidate", k[1], k[0]+1)
		}
	}
}

// TestFaultSparesHighPriority: an instance's own connection is, for a
// while, a high priority thread on Galera: while it runs DDL in total order
// isolation (Migrate at each restart of an instance) or replays a
// transaction a replicated one aborted. KILL then answers error 1095 ("a
// high priority thread/query and cannot be killed"), which used to fail
// the chaos run. Fault must take it as "no kill this time". Here the only
// connection of the instances' user runs a table rebuild (ALTER TABLE
// FORCE, under TOI) while Fault is called.
func TestFaultSparesHighPriority(t *testing.T) {
	dsns := nodeDSNs(t)
	b := chaos.NewMySQL(t, "Galera", [2]string{dsns[0], dsns[0]})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg, err := mysqlstore.ParseURL(b.DSN(0))
	if err != nil {
		t.Fatal(err)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, "CREATE TABLE big (id INT AUTO_INCREMENT PRIMARY KEY, v CHAR(200)) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO big (v) SELECT REPEAT('x', 200) FROM seq_1_to_400000"); err != nil {
		t.Fatal(err)
	}
	admin := mysqlstoretest.Open(t, mysqlstoretest.Config(t, dsns[0]))
	// rebuilding: the ALTER is past the start of its total order isolation
	// (the state is set inside the DDL, after TOI began).
	rebuilding := func() bool {
		var n int
		if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST"+
			" WHERE info LIKE 'ALTER TABLE big FORCE%' AND state = 'altering table'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	during := 0 // Fault calls with the rebuild under TOI before and after
	for attempt := 0; attempt < 3 && during == 0; attempt++ {
		done := make(chan error, 1)
		go func() {
			_, err := db.ExecContext(ctx, "ALTER TABLE big FORCE")
			done <- err
		}()
	rebuild:
		for {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the rebuild was killed or failed: %v", err)
				}
				break rebuild
			default:
			}
			if !rebuilding() {
				time.Sleep(5 * time.Millisecond) // polling for the state, not waiting for it to be reached
				continue
			}
			n, err := b.Fault(ctx)
			if err != nil {
				t.Fatalf("Fault against a high priority connection of the instances: %v", err)
			}
			if n != 0 {
				t.Errorf("Fault reports %d kills; the only connection was the rebuild, which cannot be killed", n)
			}
			if rebuilding() {
				during++
			}
		}
	}
	if during == 0 {
		t.Fatal("no Fault call happened while the rebuild ran (three rebuilds): the test proved nothing")
	}
	t.Logf("%d Fault calls while the instances' only connection rebuilt a table", during)
}
