package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// DefaultBusyTimeoutMS is the busy_timeout OpenDB sets: how long a
// connection waits for SQLite's write lock before failing with SQLITE_BUSY.
const DefaultBusyTimeoutMS = 10_000

// DefaultMaxIdleConns is the idle pool OpenDB keeps (database/sql's
// default is 2).
const DefaultMaxIdleConns = 32

// OpenDB opens the SQLite database file at path (created if missing)
// through modernc.org/sqlite, a pure-Go driver, with the settings the store
// needs on every connection:
//
//   - busy_timeout(10000): a writer waits up to 10s for the write lock
//     instead of failing at once;
//   - journal_mode(WAL): readers never wait for the writer (Migrate sets
//     it too; it is a property of the file);
//   - synchronous(FULL): a commit is on disk when it returns, so a
//     completed record survives a power loss, not only a crash;
//   - foreign_keys(1), and _txlock=immediate: transactions begun through
//     database/sql take the write lock at BEGIN.
//
// It keeps up to DefaultMaxIdleConns idle connections. path is a file name, not a URI, and must not be ":memory:" (each
// connection would get its own database). It pings the database once.
func OpenDB(ctx context.Context, path string) (*sql.DB, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, fmt.Errorf("sqlitestore: open: %q: want the path of a database file", path)
	}
	db, err := sql.Open("sqlite", dsn(path, DefaultBusyTimeoutMS))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open: %w", err)
	}
	// database/sql keeps 2 idle connections by default: a burst of
	// concurrent reads (duplicates, waiters' polls) would then open and
	// close connections over and over, each open parsing the schema and
	// running the pragmas, and the queue behind them reached the engine's
	// 5s commit timeout under -race (idemtest concurrent_100_wait_all_201).
	db.SetMaxIdleConns(DefaultMaxIdleConns)
	if err := db.PingContext(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("sqlitestore: open: %w", err), db.Close())
	}
	return db, nil
}

// dsn is the data source name of the database file at path with the
// settings OpenDB describes, and busy_timeout busyMS.
func dsn(path string, busyMS int) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyMS))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: path}).EscapedPath(), RawQuery: q.Encode()}
	return u.String()
}
