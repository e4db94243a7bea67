package chaos

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/sqlitestore"
)

// sqliteBackend is one SQLite file in the test's temporary directory,
// shared by both instances (two processes on one file: SQLite's file locks
// decide, and a SIGKILLed instance leaves a hot WAL for the next opener).
// It has no server connections to kill: Fault does nothing, and the run's
// faults are the SIGKILLs alone.
type sqliteBackend struct {
	path string
	db   *sql.DB // the test's own reader
}

// NewSQLite returns a backend on a fresh file.
func NewSQLite(t *testing.T) Backend {
	t.Helper()
	path := filepath.Join(t.TempDir(), "payments.db")
	db, err := sqlitestore.OpenDB(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &sqliteBackend{path: path, db: db}
}

func (s *sqliteBackend) Name() string                       { return "SQLite" }
func (s *sqliteBackend) DSN(int) string                     { return "sqlite://" + s.path }
func (s *sqliteBackend) Fault(context.Context) (int, error) { return 0, nil }

// NoConnections tells Run that Fault has nothing to kill: a run without
// connection kills still had chaos.
func (s *sqliteBackend) NoConnections() {}

func (s *sqliteBackend) Ledger(ctx context.Context) (map[string]LedgerRow, int, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT id, user_id, provider_charge_id FROM payments")
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

func (s *sqliteBackend) Records(ctx context.Context) (processing, lapsed, failed int, err error) {
	err = s.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(status = 'processing'), 0), "+
		"COALESCE(SUM(status = 'processing' AND locked_until < unixepoch('subsec') * 1000000), 0), "+
		"COALESCE(SUM(status = 'failed'), 0) FROM idem_records").Scan(&processing, &lapsed, &failed)
	return processing, lapsed, failed, err
}
