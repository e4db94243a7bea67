package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// raceRetries bounds how often Claim calls the procedure again when the
// record changed between its read and its write (see migrations 0002, 0003 and 0006).
const raceRetries = 4

// Store is a core.Store backed by MySQL 8.0+ or MariaDB 10.6+ (Galera
// included). It is safe for concurrent use by any number of goroutines and
// processes sharing the database: the database decides ownership. Create it
// with New after running Migrate.
type Store struct {
	db    *sql.DB
	txDB  *sql.DB
	cfg   config
	names names
	sql   statements
	stmts *sqlkit.StmtCache
	// txStmts are the statements run in Tx's transactions: stmts, or with
	// WithTxPool its own cache on that pool (database/sql runs a statement
	// in a transaction only if it was prepared on the transaction's pool).
	txStmts *sqlkit.StmtCache
	// deferredKept counts the deferred queries kept prepared in stmts
	// (deferredStmts).
	deferredKept atomic.Int64

	// schemaVersion is the highest migration this binary ships; schemaOK is
	// set once the database has it (checkSchema), galera once the server
	// reported wsrep_on=ON at the same time.
	schemaVersion int
	schemaOK      atomic.Bool
	galera        atomic.Bool
	// forceCausal sends the causal-read prefix even without Galera (tests:
	// the prefixed statements must work on plain MariaDB too).
	forceCausal bool
	// mix: how often claims find their key existing; the new key's claim
	// (claimNew) goes first while under half do.
	mix storekit.ClaimMix
}

var _ core.Store = (*Store)(nil)

// New returns a Store using db. It validates the options and touches no
// database; run Migrate (with the same options) before first use. New never
// panics; a nil db or an invalid option is an error.
//
// db may come from any DSN the go-sql-driver accepts: the store reads every
// instant as an integer computed by the server from UTC_TIMESTAMP(6), so it
// needs neither parseTime nor loc nor a particular time_zone. See the README
// for the DSN parameters recommended on Galera.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("mysqlstore: new: db is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	s := &Store{
		db:    db,
		txDB:  db,
		cfg:   cfg,
		names: cfg.names(),
		sql:   buildStatements(cfg),
		stmts: sqlkit.NewStmtCache(db),
	}
	// Insert first, a replay costs the insert and the SELECT; read first,
	// a new key costs the SELECT and the claim procedure: each pays while
	// its case is the more common.
	s.mix.Switch = 0.5
	s.txStmts = s.stmts
	if cfg.TxDB != nil && cfg.TxDB != db {
		s.txDB = cfg.TxDB
		s.txStmts = sqlkit.NewStmtCache(cfg.TxDB)
	}
	migs, err := loadMigrations(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: new: %w", err)
	}
	for _, m := range migs {
		s.schemaVersion = max(s.schemaVersion, m.version)
	}
	return s, nil
}

// DB returns the *sql.DB the store runs its statements on.
func (s *Store) DB() *sql.DB { return s.db }

// Galera reports whether the server answered wsrep_on=ON when the store
// first claimed (false before the first claim).
func (s *Store) Galera() bool { return s.galera.Load() }

// Close releases the statements the store prepared. It does not close the
// *sql.DB. Using the store after Close returns an error.
func (s *Store) Close() {
	s.stmts.Close()
	if s.txStmts != s.stmts {
		s.txStmts.Close()
	}
}

// stmt returns the prepared statement for query, preparing it on first use.
func (s *Store) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	return s.stmts.Get(ctx, query)
}

// causal prefixes query with a causal-read wait when the store talks to a
// Galera node (MariaDB syntax; see WithCausalReads).
func (s *Store) causal(query string) string {
	if s.cfg.causal && (s.galera.Load() || s.forceCausal) {
		return "SET STATEMENT wsrep_sync_wait = 1 FOR " + query
	}
	return query
}

// wrap adds the operation to err, makes a cancelled or expired context
// visible to errors.Is, and says what to do about a missing schema. It
// never adds an idempotency key.
func wrap(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("mysqlstore: %s: %w: %w", op, cerr, err)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == 1146 || me.Number == 1305) {
		// ER_NO_SUCH_TABLE / ER_SP_DOES_NOT_EXIST: the schema is missing or
		// older than this binary.
		return fmt.Errorf("mysqlstore: %s: schema not migrated for this version (run mysqlstore.Migrate at start-up with the same options): %w", op, err)
	}
	return fmt.Errorf("mysqlstore: %s: %w", op, err)
}

// retryable reports a deadlock or Galera certification conflict (1213) or
// a lock wait timeout (1205): the statement was rolled back and may be sent
// again.
func retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// withRetry runs fn, again after a retryable error, at most cfg.retries
// more times, with a short jittered pause (so two nodes' losers do not
// collide again in lockstep).
func (s *Store) withRetry(ctx context.Context, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || !retryable(err) || attempt >= s.cfg.retries || ctx.Err() != nil {
			return err
		}
		pause := time.Duration(1+rand.IntN(1<<min(attempt, 5))) * time.Millisecond
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

func micros(d time.Duration) int64 { return d.Microseconds() }

func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// checkSchema makes sure, once per Store, that the database has every
// migration this binary ships, before the first claim (a binary newer than
// its schema would otherwise run handlers whose Complete then fails), and
// asks the server whether it is a Galera node. Two statements, on the first
// claim only (and again after a failure).
func (s *Store) checkSchema(ctx context.Context) error {
	// Galera first: on a cluster the version must be read causally, or a
	// node that has not yet applied another node's Migrate reports an old
	// schema. SHOW VARIABLES answers no row (not an error) where wsrep
	// does not exist (MySQL, MariaDB built without Galera).
	var name, value string
	err := s.db.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&name, &value)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return wrap(ctx, "claim: detect galera", err)
	default:
		s.galera.Store(value == "ON" || value == "1")
	}
	var v sql.NullInt64
	err = s.db.QueryRowContext(ctx, s.causal(`SELECT MAX(version) FROM `+s.names.migrations+` WHERE table_name = ?`),
		s.cfg.Table).Scan(&v)
	if err != nil {
		return wrap(ctx, "claim: check schema version", err)
	}
	if !v.Valid || int(v.Int64) < s.schemaVersion {
		return fmt.Errorf("mysqlstore: claim: schema not migrated for this version: table %s is at version %d, this binary needs %d (run mysqlstore.Migrate at start-up with the same options)",
			s.names.table, v.Int64, s.schemaVersion)
	}
	s.schemaOK.Store(true)
	return nil
}

// Claim implements core.Store. While most claims are of new keys
// (storekit.ClaimMix), first one CALL of the new key's claim (migration
// 0007): a token and an insert, nothing read. When the key exists, and
// first once most keys do (a retry storm), a plain SELECT of the record:
// one that is not claimable (completed, or in flight) is the answer, and a
// missing one, read first, gets the new key's CALL. Only a claimable key
// (or one created between the two) gets one CALL of the claim procedure
// (migration 0006), which reads, and only when the key is claimable draws
// a token, upserts and reads its answer in the same transaction. A
// deadlock or Galera certification conflict (1213) is retried:
// the retry reads the winner's record, so the loser answers like any
// duplicate. When the record changed between the procedure's read and its
// write (it answered a claimable record it did not claim, or none), the
// procedure is called again, at most raceRetries times.
func (s *Store) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	const op = "claim"
	if err := ctx.Err(); err != nil {
		return storekit.ClaimResult{}, wrap(ctx, op, err)
	}
	if err := sqlkit.ValidClaim(&req); err != nil {
		return storekit.ClaimResult{}, fmt.Errorf("mysqlstore: claim: %w", err)
	}
	if !s.schemaOK.Load() {
		if err := s.checkSchema(ctx); err != nil {
			return storekit.ClaimResult{}, err
		}
	}
	insertFirst := !s.cfg.readFirst && s.mix.InsertFirst()
	if insertFirst {
		res, created, err := s.retried(ctx, &req, s.claimNew)
		if err != nil {
			return storekit.ClaimResult{}, wrap(ctx, op, err)
		}
		s.mix.Observe(!created)
		if created {
			return res, nil
		}
	}
	// A plain SELECT answers a key that is not claimable: a retry of a
	// completed key, a duplicate of one in flight (the article's design
	// reads it so too; the claim procedure costs up to twice as much,
	// BENCHMARKS.md §2). A missing or claimable key (lapsed, failed,
	// expired) goes to the claim procedure, which decides.
	res, found, err := s.retried(ctx, &req, s.read)
	if err != nil {
		return storekit.ClaimResult{}, wrap(ctx, op, err)
	}
	if found && !sqlkit.Claimable(&res.Record, res.Now, &req) {
		if !insertFirst {
			s.mix.Observe(true)
		}
		return res, nil
	}
	if !found && !insertFirst {
		// A new key while reading first (a retry storm, WithReadFirst):
		// the new key's cheap claim, as when inserting first; the claim
		// procedure only if another request created the key meanwhile.
		res, created, err := s.retried(ctx, &req, s.claimNew)
		if err != nil {
			return storekit.ClaimResult{}, wrap(ctx, op, err)
		}
		if created {
			s.mix.Observe(false)
			return res, nil
		}
	}
	res, err = s.claim(ctx, &req)
	if err != nil {
		return storekit.ClaimResult{}, wrap(ctx, op, err)
	}
	if !insertFirst {
		s.mix.Observe(!res.Fresh) // a key recreated past its expiry counts as new
	}
	return res, nil
}

// claim runs the claim procedure (migration 0006) until its answer is
// final (see Claim).
func (s *Store) claim(ctx context.Context, req *storekit.ClaimRequest) (storekit.ClaimResult, error) {
	for race := 0; ; race++ {
		res, found, err := s.retried(ctx, req, s.claimOnce)
		if err != nil {
			return storekit.ClaimResult{}, err
		}
		if found && (res.Claimed || !sqlkit.Claimable(&res.Record, res.Now, req)) {
			return res, nil
		}
		if race >= raceRetries {
			if found {
				return res, nil // a record that keeps changing: answer it as it stands
			}
			return storekit.ClaimResult{}, fmt.Errorf("the record kept vanishing between read and write (%d attempts)", race+1)
		}
	}
}

// retried runs one of the claim's statements (read, claimNew, claimOnce),
// again after a deadlock or certification conflict (withRetry).
func (s *Store) retried(ctx context.Context, req *storekit.ClaimRequest,
	run func(context.Context, *storekit.ClaimRequest) (storekit.ClaimResult, bool, error),
) (res storekit.ClaimResult, ok bool, err error) {
	err = s.withRetry(ctx, func() error {
		res, ok, err = run(ctx, req)
		return err
	})
	return res, ok, err
}

// claimNew creates req's record if its key does not exist (migration
// 0007): created reports whether it did; if not, nothing was written.
func (s *Store) claimNew(ctx context.Context, req *storekit.ClaimRequest) (res storekit.ClaimResult, created bool, err error) {
	var token, now int64
	created, err = s.callClaim(ctx, s.sql.claimNew, req, func(rows *sql.Rows) error { return rows.Scan(&token, &now) })
	if err != nil || !created {
		return storekit.ClaimResult{}, false, err
	}
	// What the procedure wrote, at its clock (DATETIME(6) arithmetic on
	// whole microseconds, as here).
	at := fromMicros(now)
	res.Claimed, res.Fresh, res.Now = true, true, at
	res.Record = storekit.Record{
		Scope: req.Scope, Key: req.Key, Method: req.Method, Route: req.Route, Fingerprint: req.Fingerprint,
		Status: storekit.StatusProcessing, Token: token,
		LockedUntil: at.Add(time.Duration(micros(req.Lease)) * time.Microsecond),
		CreatedAt:   at,
		ExpiresAt:   at.Add(time.Duration(micros(req.Retention)) * time.Microsecond),
	}
	return res, true, nil
}

// claimOnce calls the claim procedure (migration 0006) once.
func (s *Store) claimOnce(ctx context.Context, req *storekit.ClaimRequest) (storekit.ClaimResult, bool, error) {
	var (
		res storekit.ClaimResult
		rec storekit.Record
		now int64
	)
	found, err := s.callClaim(ctx, s.causal(s.sql.claim), req, func(rows *sql.Rows) error {
		var err error
		rec, err = scanRecord(rows, &res.Claimed, &now)
		return err
	})
	if err != nil || !found {
		return storekit.ClaimResult{}, false, err
	}
	rec.Scope, rec.Key = req.Scope, req.Key
	res.Record, res.Now = rec, fromMicros(now)
	// A claim that created the record (new key, or new again) set
	// created_at to the procedure's clock; a takeover keeps the older one.
	res.Fresh = res.Claimed && rec.CreatedAt.Equal(res.Now)
	return res, true, nil
}

// callClaim calls a claim procedure (query, its CALL) with req and scans
// its one row, if any (found), with scan.
func (s *Store) callClaim(ctx context.Context, query string, req *storekit.ClaimRequest, scan func(*sql.Rows) error) (found bool, err error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return false, err
	}
	rows, err := st.QueryContext(ctx, req.Scope, req.Key, req.Method, req.Route, req.Fingerprint,
		micros(req.Lease), micros(req.Retention), micros(s.cfg.ClockOffset))
	if err != nil {
		return false, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return false, err
		}
		return false, rows.Close()
	}
	if err := scan(rows); err != nil {
		return false, err
	}
	// Drain the CALL's trailing status result before the connection is reused.
	return true, rows.Close()
}

// read is the claim's SELECT (see Claim): the record as Get reads it
// (causal on Galera), and the clock.
func (s *Store) read(ctx context.Context, req *storekit.ClaimRequest) (storekit.ClaimResult, bool, error) {
	st, err := s.stmt(ctx, s.causal(s.sql.get))
	if err != nil {
		return storekit.ClaimResult{}, false, err
	}
	var (
		res     storekit.ClaimResult
		claimed bool
		now     int64
	)
	rec, err := scanRecord(st.QueryRowContext(ctx, req.Scope, req.Key), &claimed, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return storekit.ClaimResult{}, false, nil
	}
	if err != nil {
		return storekit.ClaimResult{}, false, err
	}
	rec.Scope, rec.Key = req.Scope, req.Key
	res.Record, res.Now = rec, fromMicros(now)
	return res, true, nil
}

// scanRecord scans the record columns (sqlkit.ScanRecord), then claimed
// and now (µs), as the claim procedure and Get answer them, then extra
// destinations. Scope and key are the caller's.
func scanRecord(row sqlkit.Scanner, claimed *bool, now *int64, extra ...any) (storekit.Record, error) {
	return sqlkit.ScanRecord(row, append([]any{claimed, now}, extra...)...)
}

// fenced runs a fenced UPDATE (retried after a deadlock or certification
// conflict) on the store's pool, and reports whether it matched the record.
func (s *Store) fenced(ctx context.Context, query string, args ...any) (bool, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return false, err
	}
	var n int64
	err = s.withRetry(ctx, func() error {
		res, err := st.ExecContext(ctx, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n > 0, err
}

// Heartbeat implements core.Store. One UPDATE.
func (s *Store) Heartbeat(ctx context.Context, f storekit.Fence, extend time.Duration) error {
	const op = "heartbeat"
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	if extend < time.Microsecond {
		return fmt.Errorf("mysqlstore: heartbeat: extension %v must be positive (at least 1µs)", extend)
	}
	ok, err := s.fenced(ctx, s.sql.heartbeat, micros(extend), micros(extend), f.Scope, f.Key, f.Token)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !ok {
		return fmt.Errorf("mysqlstore: heartbeat: %w", core.ErrLeaseLost)
	}
	return nil
}

func completeArgs(f storekit.Fence, resp storekit.StoredResponse) []any {
	header, body := sqlkit.ResponseBlobs(resp)
	return []any{int32(resp.Status), header, body, resp.NotRetained, f.Scope, f.Key, f.Token}
}

// Complete implements core.Store: one fenced UPDATE.
//
// When ctx carries the lease for f and Tx began a transaction for it, the
// fenced UPDATE runs inside that transaction, followed by the statements
// queued by Defer, and the transaction is then committed: the handler's
// writes and the stored response become one atomic fact. Without Tx,
// deferred statements get a transaction of their own with the fenced
// UPDATE. If the fence no longer matches, the transaction is rolled back
// (the handler's writes vanish) and ErrLeaseLost is returned.
func (s *Store) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	const op = "complete"
	if err := ctx.Err(); err != nil {
		s.abandonTx(ctx, f)
		return wrap(ctx, op, err)
	}
	if resp.Status < 100 || resp.Status > 999 {
		s.abandonTx(ctx, f)
		return fmt.Errorf("mysqlstore: complete: invalid response status %d", resp.Status)
	}
	args := completeArgs(f, resp)
	tx, marked, deferred := s.takeTx(ctx, f)
	if tx != nil {
		return s.completeInTx(ctx, tx, marked, f, deferred, args)
	}
	if len(deferred) > 0 {
		return s.completeDeferred(ctx, f, deferred, args)
	}
	ok, err := s.fenced(ctx, s.sql.complete, args...)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !ok {
		return fmt.Errorf("mysqlstore: complete: %w", core.ErrLeaseLost)
	}
	return nil
}

// Fail implements core.Store. One UPDATE. A transaction begun by Tx for
// this lease is rolled back first; statements queued by Defer are dropped.
// If the handler had committed that transaction itself, or the server had
// committed it (a statement that commits implicitly: DDL, LOCK TABLES) or
// rolled it back (its later statements then autocommitted), the record is
// completed as not retained instead of failed (see Tx): its writes must
// not run again.
func (s *Store) Fail(ctx context.Context, f storekit.Fence) error {
	const op = "fail"
	tx, marked, _ := s.takeTx(ctx, f)
	marked = marked && tx != nil
	if marked {
		// Does the transaction still see its commit mark? Not if the
		// server rolled it back behind database/sql's back: then the
		// handler's later statements autocommitted, and the key must not
		// be released (see Tx). One round trip, on this path only.
		var n int
		err := tx.QueryRowContext(ctx, s.markSQL(s.sql.markSeen, f.Token)).Scan(&n)
		if err == nil && n == 0 {
			_ = tx.Rollback()
			if err := s.endAfterServerRollback(ctx, op, f); !errors.Is(err, ErrTxRolledByServer) {
				return err
			}
			return nil // the record ended, as not retained
		}
	}
	if sqlkit.Abandon(tx, marked) {
		if done, err := s.failCommitted(ctx, f); done {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	ok, err := s.fenced(ctx, s.sql.fail, f.Scope, f.Key, f.Token)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !ok && marked {
		// The rollback succeeded, yet the fenced fail refused the record:
		// a lost lease, or the commit mark landed (the server committed
		// the transaction on its own before the rollback).
		if done, err := s.failCommitted(ctx, f); done {
			return err
		}
	}
	if !ok {
		return fmt.Errorf("mysqlstore: fail: %w", core.ErrLeaseLost)
	}
	return nil
}

// failCommitted is Fail once the lease's transaction has ended in a way
// idem did not decide: done reports that the commit mark said its writes
// committed (the record is then completed as not retained) or could not be
// read; err is Fail's answer then.
func (s *Store) failCommitted(ctx context.Context, f storekit.Fence) (done bool, err error) {
	committed, err := s.failAfterHandlerCommitted(ctx, f)
	switch {
	case errors.Is(err, core.ErrLeaseLost):
		return true, fmt.Errorf("mysqlstore: fail: %w", err)
	case err != nil:
		return true, wrap(ctx, "fail: the lease transaction was ended outside idem: read its commit mark, or complete the record as not retained", err)
	}
	return committed, nil
}

// Get implements core.Store. One SELECT (a causal read on Galera, see
// WithCausalReads). An expired record is returned as stored.
func (s *Store) Get(ctx context.Context, scope, key string) (storekit.Record, error) {
	const op = "get"
	if err := ctx.Err(); err != nil {
		return storekit.Record{}, wrap(ctx, op, err)
	}
	st, err := s.stmt(ctx, s.causal(s.sql.get))
	if err != nil {
		return storekit.Record{}, wrap(ctx, op, err)
	}
	var (
		claimed bool
		now     int64
		r       storekit.Record
	)
	err = s.withRetry(ctx, func() error {
		var err error
		r, err = scanRecord(st.QueryRowContext(ctx, scope, key), &claimed, &now)
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return storekit.Record{}, fmt.Errorf("mysqlstore: get: %w", storekit.ErrNotFound)
	}
	if err != nil {
		return storekit.Record{}, wrap(ctx, op, err)
	}
	r.Scope, r.Key = scope, key
	return r, nil
}
