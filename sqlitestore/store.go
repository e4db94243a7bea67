package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// Store is a core.Store backed by one SQLite database file. It is safe for
// concurrent use by any number of goroutines, and by several processes on
// the same host opening the same file: SQLite's file locks decide
// ownership. Create it with New after running Migrate.
type Store struct {
	db    *sql.DB
	txDB  *sql.DB
	cfg   config
	names names
	sql   statements
	stmts *sqlkit.StmtCache

	schemaVersion int
	schemaOK      atomic.Bool

	// txs holds the open lease transactions (Tx) by fence, so that their
	// heartbeats run inside them (see Heartbeat).
	txMu sync.Mutex
	txs  map[storekit.Fence]*sqlkit.LeaseState

	watch watchers
	// wr serialises the store's own writes in this process and commits
	// them in groups (writer.go).
	wr *writer
	// claims: the keys a goroutine of this Store is claiming on the write
	// path (claim.go, claiming).
	cmu    sync.Mutex
	claims map[watchKey]chan struct{}
}

var _ core.Store = (*Store)(nil)

// New returns a Store using db. It validates the options and touches no
// database; run Migrate (with the same options) before first use. db must
// open a database file (not :memory:) with a busy timeout, e.g. one from
// OpenDB. New never panics; a nil db or an invalid option is an error.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlitestore: new: db is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	s := &Store{
		db: db, txDB: db, cfg: cfg, names: cfg.names(), sql: buildStatements(cfg),
		stmts: sqlkit.NewStmtCache(db), txs: map[storekit.Fence]*sqlkit.LeaseState{}, wr: newWriter(db),
		claims: map[watchKey]chan struct{}{},
	}
	s.watch.init(s)
	s.wr.alone = cfg.ungrouped
	if cfg.TxDB != nil {
		s.txDB = cfg.TxDB
	}
	migs, err := loadMigrations(cfg)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: new: %w", err)
	}
	for _, m := range migs {
		s.schemaVersion = max(s.schemaVersion, m.version)
	}
	return s, nil
}

// DB returns the *sql.DB the store runs its statements on.
func (s *Store) DB() *sql.DB { return s.db }

// Close releases the statements the store prepared and stops its watch
// poller. It does not close the *sql.DB. Using the store after Close
// returns an error.
func (s *Store) Close() {
	s.watch.close()
	s.stmts.Close()
}

// stmt returns the prepared statement for query, preparing it on first use.
func (s *Store) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	return s.stmts.Get(ctx, query)
}

// inTx returns the prepared statement for query bound to tx.
func (s *Store) inTx(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return tx.StmtContext(ctx, st), nil
}

// wrap adds the operation to err, makes a cancelled or expired context
// visible to errors.Is, and says what to do about a missing schema. It
// never adds an idempotency key.
func wrap(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("sqlitestore: %s: %w: %w", op, cerr, err)
	}
	if strings.Contains(err.Error(), "no such table") {
		return fmt.Errorf("sqlitestore: %s: schema not migrated for this version (run sqlitestore.Migrate at start-up with the same options): %w", op, err)
	}
	return fmt.Errorf("sqlitestore: %s: %w", op, err)
}

func micros(d time.Duration) int64 { return d.Microseconds() }

func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// checkSchema makes sure, once per Store, that the database has every
// migration this binary ships and that its connections wait for the write
// lock instead of failing at once.
func (s *Store) checkSchema(ctx context.Context) error {
	var bt int64
	if err := s.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&bt); err != nil {
		return wrap(ctx, "claim: read busy_timeout", err)
	}
	if bt <= 0 {
		return errors.New("sqlitestore: claim: the connection's busy_timeout is 0: concurrent writers would fail with SQLITE_BUSY at once (open the database with sqlitestore.OpenDB, or add _pragma=busy_timeout(10000) to the DSN)")
	}
	var v sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT MAX(version) FROM `+s.names.migrations+` WHERE table_name = ?`, s.cfg.Table).Scan(&v)
	if err != nil {
		return wrap(ctx, "claim: check schema version", err)
	}
	if !v.Valid || int(v.Int64) < s.schemaVersion {
		return fmt.Errorf("sqlitestore: claim: schema not migrated for this version: table %s is at version %d, this binary needs %d (run sqlitestore.Migrate at start-up with the same options)",
			s.names.table, v.Int64, s.schemaVersion)
	}
	s.schemaOK.Store(true)
	return nil
}

// b binds a string as a BLOB: SQLite never finds a TEXT value equal to a
// BLOB, and BLOBs compare byte for byte.
func b(v string) []byte {
	if v == "" {
		return []byte{}
	}
	return []byte(v)
}

// scanRecord scans the record columns (sqlkit.ScanRecord), then now
// (µs), then extra destinations. Scope and key are the caller's.
func scanRecord(row sqlkit.Scanner, now *int64, extra ...any) (storekit.Record, error) {
	return sqlkit.ScanRecord(row, append([]any{now}, extra...)...)
}
