package galera

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// cluster is one fresh database seen through each of the three nodes.
type cluster struct {
	name string           // the database
	cfg  [3]*mysql.Config // per node, DBName set
	db   [3]*sql.DB
}

// newCluster creates a fresh database (through node 1; DDL replicates to
// every node in total order), migrates mysqlstore there, and opens a pool
// per node. Everything is dropped and closed when the test ends.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	dsns := nodeDSNs(t)
	c := &cluster{}
	base := mysqlstoretest.Database(t, dsns[0])
	c.name = base.DBName
	for i, dsn := range dsns {
		cfg := mysqlstoretest.Config(t, dsn)
		cfg.DBName = c.name
		c.cfg[i] = cfg
		c.db[i] = openNode(t, cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := mysqlstore.Migrate(ctx, c.db[0]); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return c
}

// openNode opens a pool on one node. The database was created through
// node 1: another node may apply the CREATE DATABASE a moment later, so the
// first ping is retried briefly.
func openNode(t *testing.T, cfg *mysql.Config) *sql.DB {
	t.Helper()
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("connector for %s: %v", cfg.Addr, err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	t.Cleanup(func() { _ = db.Close() })
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return db
		}
		if time.Now().After(deadline) {
			t.Fatalf("galera node %s unreachable (database %s): %v", cfg.Addr, cfg.DBName, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stores opens one mysqlstore per node.
func (c *cluster) stores(t *testing.T, opts ...mysqlstore.Option) [3]*mysqlstore.Store {
	t.Helper()
	var out [3]*mysqlstore.Store
	for i, db := range c.db {
		s, err := mysqlstore.New(db, opts...)
		if err != nil {
			t.Fatalf("new store on node %d: %v", i+1, err)
		}
		t.Cleanup(s.Close)
		out[i] = s
	}
	return out
}

// certStats sums, over the three nodes, the transactions that failed
// certification and the local transactions aborted by a replicated one:
// evidence that a test actually raced the nodes against each other.
func (c *cluster) certStats(t *testing.T) (certFailures, bfAborts int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, db := range c.db {
		rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')")
		if err != nil {
			t.Fatalf("node %d status: %v", i+1, err)
		}
		for rows.Next() {
			var name string
			var v int64
			if err := rows.Scan(&name, &v); err != nil {
				t.Fatal(err)
			}
			if name == "wsrep_local_cert_failures" {
				certFailures += v
			} else {
				bfAborts += v
			}
		}
		rows.Close()
	}
	return certFailures, bfAborts
}
