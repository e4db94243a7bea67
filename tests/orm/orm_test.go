package orm

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
	"github.com/idemkit/idem/sqlitestore"
	"github.com/idemkit/idem/sqlitestore/sqlitestoretest"
)

// backend is a store of record with the database/sql face of its lease
// transaction.
type backend struct {
	name   string // postgres, mysql, sqlite
	driver string // the database/sql driver's name (sqlx's bind variables)
	store  core.Store
	// db is the same database outside any lease: the ledger's DDL, the
	// counts, the ORMs' start-up handles, and the negative control's
	// writes.
	db *sql.DB
	tx func(context.Context) (*sql.Tx, error) // pgstore.SQLTx, mysqlstore.Tx, sqlitestore.Tx
}

// ledgerDDL is the business table every handler books one row in (k: the
// idempotency key, so a double booking shows as two rows).
var ledgerDDL = map[string]string{
	"postgres": "CREATE TABLE ledger (id bigserial PRIMARY KEY, k text NOT NULL)",
	"mysql":    "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(255) NOT NULL) ENGINE = InnoDB",
	"sqlite":   "CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT NOT NULL)",
}

var backends = []struct {
	name string
	open func(t *testing.T) *backend
}{
	{"postgres", openPostgres},
	{"mysql", openMySQL},
	{"sqlite", openSQLite},
}

// openPostgres migrates pgstore into a fresh schema (pgstoretest; an
// unreachable server fails the test) and opens a pool whose search_path is
// that schema, so the ORMs' unqualified "ledger" is the test's own.
func openPostgres(t *testing.T) *backend {
	t.Helper()
	schema := pgstoretest.Schema(t, pgstoretest.Pool(t))
	cfg := pgstoretest.Config(t)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool := pgstoretest.NewPool(t, cfg)
	opts := []pgstore.Option{pgstore.WithSchema(schema)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, pgstore.Migrate(ctx, pool, opts...))
	store, err := pgstore.New(pool, opts...)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() }) // before the pool's Close (registered earlier)
	return &backend{name: "postgres", driver: "pgx", store: store, db: db, tx: pgstore.SQLTx}
}

// openMySQL migrates mysqlstore into a fresh database of the test server
// (mysqlstoretest; an unreachable server fails the test).
func openMySQL(t *testing.T) *backend {
	t.Helper()
	db := mysqlstoretest.NewDB(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, mysqlstore.Migrate(ctx, db))
	store, err := mysqlstore.New(db)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	return &backend{name: "mysql", driver: "mysql", store: store, db: db, tx: mysqlstore.Tx}
}

// openSQLite migrates sqlitestore into a fresh file (sqlitestoretest).
func openSQLite(t *testing.T) *backend {
	t.Helper()
	store := sqlitestoretest.Store(t)
	return &backend{name: "sqlite", driver: "sqlite", store: store, db: store.DB(), tx: sqlitestore.Tx}
}

// conn is what a handler hands its ORM: idem's *sql.Tx, or (the negative
// control) the *sql.DB.
type conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

var (
	_ conn = (*sql.Tx)(nil)
	_ conn = (*sql.DB)(nil)
)

// session is an ORM's handle on a conn, as a handler uses it.
type session interface {
	// book inserts the ledger row of key with the ORM's own insert.
	book(ctx context.Context, key string) error
	// commit and rollback end the transaction the way the ORM does.
	commit() error
	rollback() error
	// exec sends query as raw SQL through the ORM.
	exec(ctx context.Context, query string) error
}

// ormKit is one ORM: setup runs once per backend, as an application's
// start-up does, and returns how a handler opens the ORM on a conn.
type ormKit struct {
	name  string
	setup func(t *testing.T, b *backend) func(c conn) (session, error)
}

// Handler behaviours, chosen per request by the X-Behaviour header. Each
// books the key's ledger row through the ORM first.
const (
	plain         = "plain"          // 201
	handlerError  = "error"          // then 500: a retryable failure
	rollback500   = "rollback-500"   // the ORM's Rollback, then 500
	selfCommit    = "commit"         // the ORM's Commit (its error ignored), then 201
	commitChecked = "commit-checked" // the ORM's Commit, 500 if it failed, else 201
	commit500     = "commit-500"     // the ORM's Commit, then 500
	sqlCommit     = "sql-commit"     // COMMIT sent as SQL through the ORM, then 201
	sqlRollback   = "sql-rollback"   // ROLLBACK sent as SQL through the ORM, then 201
)

// world is one (ORM, backend) pair behind idem's net/http middleware.
type world struct {
	t       *testing.T
	b       *backend
	srv     http.Handler
	mu      sync.Mutex
	runs    map[string]int // handler runs per key
	visible map[string]int // the key's rows visible outside idem's transaction right after the handler booked it
}

// newWorld creates the ledger and serves the handler. outside: the
// handler's ORM writes through the *sql.DB instead of idem's transaction
// (the negative control: what the checks must catch).
func newWorld(t *testing.T, b *backend, kit ormKit, outside bool) *world {
	t.Helper()
	_, err := b.db.ExecContext(t.Context(), ledgerDDL[b.name])
	require.NoError(t, err)
	open := kit.setup(t, b)
	wd := &world{t: t, b: b, runs: map[string]int{}, visible: map[string]int{}}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get("Idempotency-Key")
		wd.mu.Lock()
		wd.runs[key]++
		wd.mu.Unlock()
		var c conn = b.db
		if !outside {
			tx, err := b.tx(ctx)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			c = tx
		}
		s, err := open(c)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := s.book(ctx, key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		n, err := wd.count(ctx, key)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		wd.mu.Lock()
		wd.visible[key] = max(wd.visible[key], n)
		wd.mu.Unlock()
		status := http.StatusCreated
		switch r.Header.Get("X-Behaviour") {
		case handlerError:
			status = http.StatusInternalServerError
		case rollback500:
			_ = s.rollback()
			status = http.StatusInternalServerError
		case selfCommit:
			_ = s.commit()
		case commitChecked:
			if err := s.commit(); err != nil {
				status = http.StatusInternalServerError
			}
		case commit500:
			_ = s.commit()
			status = http.StatusInternalServerError
		case sqlCommit:
			if err := s.exec(ctx, "COMMIT"); err != nil {
				status = http.StatusInternalServerError
			}
		case sqlRollback:
			if err := s.exec(ctx, "ROLLBACK"); err != nil {
				status = http.StatusInternalServerError
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"booked":%t}`, status == http.StatusCreated)
	})
	eng, err := core.New(b.store, core.WithLease(30*time.Second))
	require.NoError(t, err)
	mw, err := nethttpidem.New(eng,
		nethttpidem.WithScope(func(*http.Request) (string, error) { return "tenant", nil }),
		nethttpidem.WithRoute(func(*http.Request) string { return "/v1/ledger" }))
	require.NoError(t, err)
	wd.srv = mw(handler)
	return wd
}

// count is the key's rows as seen outside any lease transaction.
func (wd *world) count(ctx context.Context, key string) (int, error) {
	q := "SELECT COUNT(*) FROM ledger WHERE k = ?"
	if wd.b.name == "postgres" {
		q = "SELECT count(*) FROM ledger WHERE k = $1"
	}
	var n int
	err := wd.b.db.QueryRowContext(ctx, q, key).Scan(&n)
	return n, err
}

func (wd *world) rows(key string) int {
	wd.t.Helper()
	n, err := wd.count(wd.t.Context(), key)
	require.NoError(wd.t, err)
	return n
}

func (wd *world) runsOf(key string) int {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return wd.runs[key]
}

// answer is what the client got.
type answer struct {
	code     int
	replayed bool
	body     string
}

func (a answer) String() string {
	if a.replayed {
		return fmt.Sprintf("%d (replayed)", a.code)
	}
	return fmt.Sprint(a.code)
}

func ok(a answer) bool { return a.code >= 200 && a.code < 300 }

func (wd *world) do(key, behaviour string) answer {
	r := httptest.NewRequest(http.MethodPost, "/v1/ledger", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-Behaviour", behaviour)
	w := httptest.NewRecorder()
	wd.srv.ServeHTTP(w, r)
	return answer{code: w.Code, replayed: w.Header().Get("Idempotent-Replayed") == "true", body: w.Body.String()}
}

// run sends one request with behaviour, then two plain retries, and
// returns every broken promise. Always: the row is invisible outside
// idem's transaction while the handler runs; an answer (first or replayed)
// is 2xx only when exactly one row exists; never two rows; a handler whose
// writes committed is not run again. And what behaviour promises of its
// own (expect).
func (wd *world) run(behaviour string) []string {
	wd.t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	key := behaviour + "-" + hex.EncodeToString(b[:])
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	answers := []answer{wd.do(key, behaviour)}
	rowsAfter := []int{wd.rows(key)}
	runsAfterFirst := wd.runsOf(key)
	for range 2 {
		answers = append(answers, wd.do(key, plain))
		rowsAfter = append(rowsAfter, wd.rows(key))
	}
	wd.mu.Lock()
	visible := wd.visible[key]
	wd.mu.Unlock()
	if visible != 0 {
		fail("the handler's row was visible outside idem's transaction while the handler ran (%d rows): it was not written in that transaction", visible)
	}
	for i, a := range answers {
		if ok(a) && rowsAfter[i] != 1 {
			fail("answer %d: %s with %d ledger rows: a 2xx without its row", i, a, rowsAfter[i])
		}
		if rowsAfter[i] > 1 {
			fail("after answer %d: %d ledger rows: booked twice", i, rowsAfter[i])
		}
	}
	if rowsAfter[0] == 1 && wd.runsOf(key) != runsAfterFirst {
		fail("the handler ran %d times although its first run's writes had committed: a retry booked again", wd.runsOf(key))
	}
	runs, rows := wd.runsOf(key), rowsAfter[len(rowsAfter)-1]
	wd.t.Logf("%s on %s: answered %v, ledger rows after each %v, %d runs", behaviour, wd.b.name, answers, rowsAfter, runs)
	switch behaviour {
	case plain, selfCommit, sqlCommit:
		// The writes and the response commit together (or, after the
		// handler's own COMMIT, the response is recorded for writes that
		// landed): retries replay it.
		first := answers[0]
		if behaviour == sqlCommit && wd.b.name == "sqlite" && first.code == http.StatusServiceUnavailable {
			// sqlitestore today: its Complete records the response (the
			// mark says the writes landed; its statements autocommit
			// after the handler's COMMIT) and then reports the failed
			// COMMIT of a transaction SQLite no longer has: the client
			// gets 503, and its retry the stored 201.
			first = answer{code: http.StatusCreated, body: answers[1].body}
		}
		if first.code != http.StatusCreated || first.replayed {
			fail("first answer %s, want 201", first)
		}
		for _, a := range answers[1:] {
			if a.code != http.StatusCreated || !a.replayed || a.body != first.body {
				fail("retry answered %s %q, want the 201 replayed", a, a.body)
			}
		}
		if runs != 1 || rows != 1 {
			fail("%d runs, %d rows; want 1 and 1", runs, rows)
		}
	case handlerError, rollback500:
		// The row rolls back and the key is released: the retry runs
		// the handler again, and its 201 is replayed.
		if answers[0].code != http.StatusInternalServerError || rowsAfter[0] != 0 {
			fail("first answer %s with %d rows, want 500 with none (the row rolled back)", answers[0], rowsAfter[0])
		}
		if answers[1].code != http.StatusCreated || answers[1].replayed || answers[2].code != http.StatusCreated || !answers[2].replayed {
			fail("retries answered %s, %s; want a fresh 201, then that 201 replayed", answers[1], answers[2])
		}
		if runs != 2 || rows != 1 {
			fail("%d runs, %d rows; want 2 and 1", runs, rows)
		}
	case commitChecked:
		// Committed by the handler (database/sql stores) or refused
		// (pgstore: ErrTxOwned, the handler answers 500 and the key is
		// released): either way the key ends booked once, answered 201.
		if last := answers[len(answers)-1]; last.code != http.StatusCreated || !last.replayed || rows != 1 {
			fail("last retry answered %s with %d rows, want the 201 replayed with one", last, rows)
		}
	}
	return problems
}

// scenarios are the behaviours run, in order.
var scenarios = []string{plain, handlerError, rollback500, selfCommit, commitChecked, commit500, sqlCommit, sqlRollback}

// testORM runs every scenario for kit on every backend.
func testORM(t *testing.T, kit ormKit) {
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			t.Parallel()
			wd := newWorld(t, bk.open(t), kit, false)
			for _, sc := range scenarios {
				t.Run(sc, func(t *testing.T) {
					wd.t = t
					assert.Empty(t, wd.run(sc))
				})
			}
		})
	}
}

// testOutside is the negative control: the same handler writing through
// the *sql.DB instead of idem's transaction must be caught by the checks.
func testOutside(t *testing.T, kit ormKit) {
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			t.Parallel()
			wd := newWorld(t, bk.open(t), kit, true)
			for _, sc := range []string{plain, handlerError} {
				assert.NotEmpty(t, wd.run(sc), "%s: a handler writing outside idem's transaction went unnoticed", sc)
			}
		})
	}
}
