package chaos

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// postgres is a fresh schema of the PostgreSQL test database
// (IDEM_TEST_PG_DSN). The instances' connections carry an application_name
// of their own: the only backends Fault terminates.
type postgres struct {
	admin  *pgxpool.Pool
	schema string
	app    string
	dsn    string
}

// NewPostgres creates a fresh schema (dropped when the test ends) for a run.
func NewPostgres(t *testing.T) Backend {
	t.Helper()
	acfg := pgstoretest.Config(t)
	acfg.MaxConns = 2 // schema, terminations, final reads: keep max_connections for others
	admin := pgstoretest.NewPool(t, acfg)
	p := &postgres{admin: admin, schema: pgstoretest.Schema(t, admin), app: "idemchaos_" + randomHex(6)}
	p.dsn = p.instanceDSN(t)
	return p
}

// instanceDSN is the test DSN with the schema, the application_name and a
// small pool.
func (p *postgres) instanceDSN(t *testing.T) string {
	t.Helper()
	dsn := pgstoretest.DSN()
	params := map[string]string{"search_path": p.schema, "application_name": p.app, "pool_max_conns": "6"}
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("parse DSN: %v", err)
		}
		q := u.Query()
		for k, v := range params {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	for k, v := range params {
		dsn += " " + k + "=" + v
	}
	return dsn
}

func (p *postgres) Name() string   { return "PostgreSQL" }
func (p *postgres) DSN(int) string { return p.dsn }

func (p *postgres) Fault(ctx context.Context) (int, error) {
	var n int
	err := p.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
	SELECT pid FROM pg_stat_activity
	WHERE application_name = $1 AND datname = current_database() AND pid <> pg_backend_pid()
	ORDER BY random() LIMIT 1) victim`, p.app).Scan(&n)
	return n, err
}

func (p *postgres) Ledger(ctx context.Context) (map[string]LedgerRow, int, error) {
	rows, err := p.admin.Query(ctx, `SELECT id, user_id, provider_charge_id FROM `+pgx.Identifier{p.schema, "payments"}.Sanitize())
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

func (p *postgres) Records(ctx context.Context) (processing, lapsed, failed int, err error) {
	err = p.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'processing'),
	count(*) FILTER (WHERE status = 'processing' AND locked_until < now()),
	count(*) FILTER (WHERE status = 'failed')
FROM `+pgx.Identifier{p.schema, "idem_records"}.Sanitize()).Scan(&processing, &lapsed, &failed)
	return processing, lapsed, failed, err
}
