package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/mysqlstore"
)

// mysqlLedger is the ledger table in the store's MySQL/MariaDB database.
// Record queues the row with mysqlstore.Defer: it is inserted in the
// transaction idem commits together with the stored response, so the row
// and the idempotency record are one atomic fact, and a stale owner's row
// rolls back with its fenced commit; no transaction is open (nor a commit
// mark written) while the handler runs. A row the database refuses fails
// the commit (500, key released), as with Tx.
type mysqlLedger struct {
	db *sql.DB
}

// isMySQLDSN reports whether -dsn selects mysqlstore.
func isMySQLDSN(dsn string) bool {
	return strings.HasPrefix(dsn, "mysql://")
}

// defaultMySQLPool is the pool size unless the DSN's pool_max_conns says
// otherwise.
const defaultMySQLPool = 32

// mysqlConfig turns mysql://user:pass@host[:port]/db[?params] into the
// go-sql-driver configuration and the pool size. params are the driver's
// DSN parameters, plus pool_max_conns (as in pgx's DSNs; default
// defaultMySQLPool). Errors never repeat the password.
func mysqlConfig(dsn string) (*mysql.Config, int, error) {
	cfg, err := parseMySQLURL(dsn)
	if err != nil {
		return nil, 0, err
	}
	pool := defaultMySQLPool
	if v, ok := cfg.Params["pool_max_conns"]; ok {
		delete(cfg.Params, "pool_max_conns")
		if pool, err = strconv.Atoi(v); err != nil || pool < 1 {
			return nil, 0, fmt.Errorf("-dsn: pool_max_conns=%q: want a positive integer", v)
		}
	}
	return cfg, pool, nil
}

func parseMySQLURL(dsn string) (*mysql.Config, error) {
	cfg, err := mysqlstore.ParseURL(dsn)
	if err != nil {
		return nil, fmt.Errorf("-dsn: %w", err)
	}
	return cfg, nil
}

// openMySQL connects, migrates the store and the ledger, and builds both.
func openMySQL(ctx context.Context, cfg config) (*sql.DB, *mysqlstore.Store, *mysqlLedger, string, error) {
	mcfg, pool, err := mysqlConfig(cfg.dsn)
	if err != nil {
		return nil, nil, nil, "", err
	}
	conn, err := mysql.NewConnector(mcfg)
	if err != nil {
		return nil, nil, nil, "", fmt.Errorf("-dsn: %w", err)
	}
	db := sql.OpenDB(conn)
	// A handler holds a connection for its transaction across the provider
	// call; bound the pool so a burst queues here instead of exhausting the
	// server's max_connections, and recycle idle connections.
	db.SetMaxOpenConns(pool)
	db.SetMaxIdleConns(pool)
	db.SetConnMaxIdleTime(5 * time.Minute)
	fail := func(err error) (*sql.DB, *mysqlstore.Store, *mysqlLedger, string, error) {
		_ = db.Close()
		return nil, nil, nil, "", err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := db.PingContext(cctx); err != nil {
		return fail(fmt.Errorf("connect: %w", err))
	}
	if err := mysqlstore.Migrate(cctx, db); err != nil {
		return fail(err)
	}
	store, err := mysqlstore.New(db, mysqlstore.WithRetentionMargin(retentionMargin(cfg)))
	if err != nil {
		return fail(err)
	}
	ledger := &mysqlLedger{db: db}
	if err := ledger.migrate(cctx); err != nil {
		return fail(fmt.Errorf("ledger migration: %w", err))
	}
	return db, store, ledger, mcfg.DBName, nil
}

// migrate creates the ledger table. CREATE TABLE IF NOT EXISTS is atomic in
// MySQL/MariaDB (and replicated in total order on Galera), so instances
// starting together need no lock. Ids and users compare byte for byte.
func (l *mysqlLedger) migrate(ctx context.Context) error {
	_, err := l.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS `payments` (\n"+
		"  id                 VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,\n"+
		"  user_id            VARBINARY(255) NOT NULL,\n"+
		"  amount             BIGINT       NOT NULL CHECK (amount > 0),\n"+
		"  currency           VARCHAR(16)  NOT NULL,\n"+
		"  recipient          VARCHAR(255) NOT NULL,\n"+
		"  provider_charge_id VARCHAR(255) NOT NULL,\n"+
		"  created_at         TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),\n"+
		"  KEY payments_user_idx (user_id, created_at, id)\n"+
		") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")
	return err
}

// Record queues the row's insert with mysqlstore.Defer: it runs in the
// transaction that stores the response.
func (l *mysqlLedger) Record(ctx context.Context, user string, p Payment) error {
	err := mysqlstore.Defer(ctx, "INSERT INTO `payments` (id, user_id, amount, currency, recipient, provider_charge_id) VALUES (?, ?, ?, ?, ?, ?)",
		p.ID, user, p.Amount, p.Currency, p.To, p.ProviderChargeID)
	if err != nil {
		return fmt.Errorf("ledger: insert: %w", err)
	}
	return nil
}

// List reads committed rows only: a payment in flight is not listed.
// created_at is read as microseconds since the epoch, which needs no
// parseTime and no time zone agreement with the server.
func (l *mysqlLedger) List(ctx context.Context, user string) ([]Payment, error) {
	rows, err := l.db.QueryContext(ctx, "SELECT id, amount, currency, recipient, provider_charge_id, "+
		"CAST(UNIX_TIMESTAMP(created_at) * 1000000 AS SIGNED) FROM `payments` WHERE user_id = ? ORDER BY created_at, id", user)
	if err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	defer rows.Close()
	ps := []Payment{}
	for rows.Next() {
		var p Payment
		var us int64
		if err := rows.Scan(&p.ID, &p.Amount, &p.Currency, &p.To, &p.ProviderChargeID, &us); err != nil {
			return nil, fmt.Errorf("ledger: list: %w", err)
		}
		p.CreatedAt = time.UnixMicro(us).UTC()
		ps = append(ps, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	return ps, nil
}
