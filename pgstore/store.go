package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// Store is a core.Store backed by PostgreSQL. It is safe for concurrent use
// by any number of goroutines and processes sharing the database: the
// database decides ownership. Create it with New after running Migrate.
type Store struct {
	pool   *pgxpool.Pool
	txPool *pgxpool.Pool
	cfg    config
	names  names
	sql    statements
	steps  stepStatements // step.go
	watch  *watchHub

	// schemaVersion is the highest migration this binary ships for the
	// store's mode; schemaOK is set once the database has it (checkSchema).
	schemaVersion int
	schemaOK      atomic.Bool

	// asyncSessions: the pool's sessions run with synchronous_commit =
	// off (read by checkSchema), so plain-mode claims do not wait for
	// their flush either: SyncClaim then makes them durable, as in
	// transactional mode.
	asyncSessions atomic.Bool

	// mix: how often claims find their key existing (insertFirst).
	mix storekit.ClaimMix
	// Unless WithoutBatching (batch.go), the statements of concurrent
	// requests, gathered: the claim function's calls, and in transactional
	// mode the bare inserts (claimbatch.go); the steps and the completes of
	// requests without a Tx, and in plain mode the bare inserts
	// (writebatch.go).
	inserts, calls claimBatch
	writes         writeBatch

	// binaryClaim: the pool's QueryExecMode can ask for the claim's
	// composite in binary (claimrow.go); otherwise sql.claimText.
	binaryClaim bool

	// listenConn: where the wait-mode listener connects; nil behind a
	// transaction pooler without WithListenConnString (listen.go).
	listenConn *pgx.ConnConfig
}

var _ core.Store = (*Store)(nil)

// New returns a Store using pool. It validates the options and touches no
// database; run Migrate (with the same options) before first use. New never
// panics; a nil pool or invalid option is an error.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: new: pool is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	s := &Store{
		pool:   pool,
		txPool: pool,
		cfg:    cfg,
		names:  cfg.names(),
		sql:    buildStatements(cfg),
		steps:  buildStepStatements(cfg),
	}
	s.initBatches()
	switch pool.Config().ConnConfig.DefaultQueryExecMode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		// No statement description, so pgx cannot ask for binary results
		// (PgBouncer set-ups, see README): claimText.
	default:
		s.binaryClaim = true
	}
	if cfg.txPool != nil {
		s.txPool = cfg.txPool
	}
	s.watch = newWatchHub(s)
	if err := s.initListen(); err != nil {
		return nil, err
	}
	migs, err := loadMigrations(cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: new: %w", err)
	}
	for _, m := range migs {
		s.schemaVersion = max(s.schemaVersion, m.version)
	}
	return s, nil
}

// Pool returns the pool the store runs its statements on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Partitioned reports whether the store uses the partitioned retention mode.
func (s *Store) Partitioned() bool { return s.cfg.partitioned }

// wrap adds the operation to err and makes sure a cancelled or expired
// context is visible to errors.Is even when pgx reports the failure in its
// own terms.
func wrap(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("pgstore: %s: %w: %w", op, cerr, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883") {
		// undefined_table / undefined_function: the schema is missing or
		// older than this binary. Say what to do, not just what failed.
		return fmt.Errorf("pgstore: %s: schema not migrated for this version (run pgstore.Migrate at start-up with the same options): %w", op, err)
	}
	if errors.As(err, &pgErr) && (pgErr.Code == "22021" || pgErr.Code == "22P05") {
		// character_not_in_repertoire / untranslatable_character: text
		// columns cannot hold NUL or invalid UTF-8. Headers are sanitised
		// (headerjson.go); a scope is not (two scopes must never merge).
		return fmt.Errorf("pgstore: %s: a value is not storable as PostgreSQL text (NUL or invalid UTF-8 in the scope, key, method or route): %w", op, err)
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// checkSchema makes sure, once per Store, that the database has every
// migration this binary ships, before the first claim: a binary newer than
// its schema would otherwise run handlers whose Complete then fails (a
// missing column), leaving the record in flight until its lease lapses.
// One statement, on the first claim only (and again after a failure),
// which also reads whether the sessions commit asynchronously
// (asyncSessions).
func (s *Store) checkSchema(ctx context.Context) error {
	var (
		v     *int32
		async bool
	)
	err := s.pool.QueryRow(ctx, `SELECT max(version), current_setting('synchronous_commit') = 'off' FROM `+s.names.migrations+` WHERE table_name = $1 AND mode = $2`,
		s.cfg.table, s.cfg.mode()).Scan(&v, &async)
	if err != nil {
		return wrap(ctx, "claim: check schema version", err)
	}
	if v == nil || int(*v) < s.schemaVersion {
		have := 0
		if v != nil {
			have = int(*v)
		}
		return fmt.Errorf("pgstore: claim: schema not migrated for this version: table %s is at version %d, this binary needs %d (run pgstore.Migrate at start-up with the same options)",
			s.names.table, have, s.schemaVersion)
	}
	s.asyncSessions.Store(async)
	s.schemaOK.Store(true)
	return nil
}

// Claim implements core.Store. While most claims carry a new key, a claim
// is a bare INSERT ... ON CONFLICT DO NOTHING, and the claim-or-read
// function (sql.go) runs only when the key exists: a first execution skips
// the PL/pgSQL call and, in plain mode, rides in the pipeline of other
// requests' completes (writebatch.go). While more than a quarter or half
// of recent claims (about the last 32; insertFirst says which) find their
// key existing, as in a retry storm, every claim calls the function first:
// one statement whatever it finds (storekit.ClaimMix; README "Claims").
//
// In partitioned mode, one case costs a second statement: when the record
// found is completed but its payload was committed after the claim
// statement's snapshot was taken (a retry racing the original request's
// completion to the microsecond), the payload join cannot see it, so Claim
// reads the record again with Get.
func (s *Store) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	const op = "claim"
	if err := ctx.Err(); err != nil {
		return storekit.ClaimResult{}, wrap(ctx, op, err)
	}
	if req.Lease <= 0 {
		return storekit.ClaimResult{}, fmt.Errorf("pgstore: claim: lease %v must be positive", req.Lease)
	}
	if req.Retention <= 0 {
		return storekit.ClaimResult{}, fmt.Errorf("pgstore: claim: retention %v must be positive", req.Retention)
	}
	if req.Lease < time.Microsecond || req.Retention < time.Microsecond {
		return storekit.ClaimResult{}, fmt.Errorf("pgstore: claim: lease %v and retention %v must be at least 1µs (database precision)", req.Lease, req.Retention)
	}
	if !s.schemaOK.Load() {
		if err := s.checkSchema(ctx); err != nil {
			return storekit.ClaimResult{}, err
		}
	}
	var cr claimRow
	for race := 0; ; race++ {
		var err error
		cr, err = s.claimRow(ctx, &req)
		if err != nil {
			return storekit.ClaimResult{}, wrap(ctx, op, err)
		}
		// A claim whose token was drawn before another request took the
		// record over (and then failed, or let its lease lapse) leaves
		// the record alone: tokens never go backwards. The record is then
		// claimable, and answering it unclaimed would turn away (409) a
		// retry that should run: claim again, with a new token.
		if cr.claimed || race >= claimRaces || !sqlkit.Claimable(&cr.rec, cr.now, &req) {
			break
		}
	}
	res := storekit.ClaimResult{Record: cr.rec, Claimed: cr.claimed, Now: cr.now, Fresh: cr.fresh()}
	if res.Record.Status == storekit.StatusCompleted && !cr.hasPayload {
		// Partitioned mode only (plain mode reads the response from the
		// row ON CONFLICT returned). See the method comment.
		r, err := s.Get(ctx, req.Scope, req.Key)
		switch {
		case err == nil && r.Token == res.Record.Token:
			res.Record = r
		case err == nil:
			// The record moved on in between (expired and re-created):
			// the claim's answer stands, without a payload we cannot see.
			return storekit.ClaimResult{}, fmt.Errorf("pgstore: claim: the record changed while reading its payload; retry")
		default:
			return storekit.ClaimResult{}, fmt.Errorf("pgstore: claim: read payload: %w", err)
		}
	}
	return res, nil
}

// claimRaces bounds how often Claim runs the claim statement again when
// it answered a record it could have claimed (see Claim).
const claimRaces = 4

// claimRow runs the claim statement: one composite value, in binary, or
// on a pool whose QueryExecMode cannot ask for binary results, its columns
// as text, scanned by pgx.
func (s *Store) claimRow(ctx context.Context, req *storekit.ClaimRequest) (claimRow, error) {
	if s.cfg.functionFirst {
		return s.claimFnBatched(ctx, req)
	}
	if !s.insertFirst() {
		cr, err := s.claimFnBatched(ctx, req)
		if err == nil {
			s.mix.Observe(!cr.fresh())
		}
		return cr, err
	}
	cr, inserted, err := s.claimNewBatched(ctx, req)
	if err != nil {
		return cr, err
	}
	s.mix.Observe(!inserted)
	if inserted {
		return cr, nil
	}
	// The key exists: the claim-or-read statement decides, as always.
	return s.claimFnBatched(ctx, req)
}

// insertFirst reports whether a claim sends the bare insert first: while
// fewer than half of recent claims found their key where the writes'
// statements are shared (plain mode, batching, a database whose CPU is the
// limit: a new key's insert rides with other requests' completes, where
// the function would cost it a statement and a commit of its own); fewer
// than a quarter elsewhere (a database a round trip away or idle, or the
// inserts in statements of their own: there an existing key's second
// round trip is the price). Measured both ways in BENCHMARKS.md §2.
// The writes' lock is taken only between the two, where it decides.
func (s *Store) insertFirst() bool {
	switch e := s.mix.Existing(); {
	case e < 0.25:
		return true
	case e >= 0.5:
		return false
	default:
		return s.cfg.batching && !s.cfg.transactional && s.writes.sharing()
	}
}

// claimFn runs the claim function (see claimRow).
func (s *Store) claimFn(ctx context.Context, req *storekit.ClaimRequest) (claimRow, error) {
	if !s.binaryClaim {
		var cr claimRow
		row := s.pool.QueryRow(ctx, s.sql.claimText,
			req.Scope, req.Key, req.Method, req.Route, req.Fingerprint,
			micros(req.Lease), micros(req.Retention))
		rec, err := scanRecord(row, &cr.hasPayload, &cr.claimed, &cr.now, &cr.created)
		cr.rec = rec
		cr.created = cr.created && cr.claimed
		return cr, err
	}
	rows, err := s.pool.Query(ctx, s.sql.claim, claimResultFormat,
		req.Scope, req.Key, req.Method, req.Route, req.Fingerprint,
		micros(req.Lease), micros(req.Retention))
	if err != nil {
		return claimRow{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return claimRow{}, err
		}
		return claimRow{}, errors.New("claim statement returned no row")
	}
	v := rows.RawValues()
	if len(v) != 1 {
		return claimRow{}, fmt.Errorf("claim statement returned %d columns, want 1", len(v))
	}
	if fd := rows.FieldDescriptions(); len(fd) != 1 || fd[0].Format != pgx.BinaryFormatCode {
		return claimRow{}, errors.New("claim statement's result came back as text, not binary (pool QueryExecMode changed after pgstore.New?)")
	}
	cr, err := decodeClaimRow(v[0], req)
	if err != nil {
		return claimRow{}, err
	}
	rows.Close()
	return cr, rows.Err()
}

// claimNew is a claim's first statement while new keys dominate: a bare
// insert of the processing record. inserted is false when the key exists.
func (s *Store) claimNew(ctx context.Context, req *storekit.ClaimRequest) (cr claimRow, inserted bool, err error) {
	return scanClaimNew(s.pool.QueryRow(ctx, s.sql.claimNew,
		req.Scope, req.Key, req.Method, req.Route, req.Fingerprint,
		micros(req.Lease), micros(req.Retention)), req)
}

// scanClaimNew reads sql.claimNew's answer: no row when the key exists.
func scanClaimNew(row pgx.Row, req *storekit.ClaimRequest) (cr claimRow, inserted bool, err error) {
	r := &cr.rec
	err = row.Scan(&r.Token, &r.LockedUntil, &r.CreatedAt, &r.ExpiresAt, &cr.now)
	if errors.Is(err, pgx.ErrNoRows) {
		return claimRow{}, false, nil
	}
	if err != nil {
		return claimRow{}, false, err
	}
	r.Scope, r.Key, r.Method, r.Route, r.Fingerprint = req.Scope, req.Key, req.Method, req.Route, req.Fingerprint
	r.Status = storekit.StatusProcessing
	cr.claimed, cr.created = true, true
	return cr, true, nil
}

// claimResultFormat asks for the claim's composite in binary (pgx would ask
// for text: it does not know the type).
var claimResultFormat = pgx.QueryResultFormats{pgx.BinaryFormatCode}

// scanRecord scans the common column list (recordCols plus the response
// columns and a has-payload flag), followed by extra destinations.
func scanRecord(row pgx.Row, hasPayload *bool, extra ...any) (storekit.Record, error) {
	var (
		r           storekit.Record
		status      string
		respStatus  *int32
		respHeader  []byte
		respBody    []byte
		notRetained bool
	)
	dst := []any{
		&r.Scope, &r.Key, &r.Method, &r.Route, &r.Fingerprint, &status, &r.Token,
		&r.LockedUntil, &r.CreatedAt, &r.ExpiresAt,
		&respStatus, &respHeader, &respBody, &notRetained, hasPayload,
	}
	if err := row.Scan(append(dst, extra...)...); err != nil {
		return storekit.Record{}, err
	}
	r.Status = storekit.Status(status)
	if r.Status == storekit.StatusCompleted && *hasPayload && respStatus != nil {
		resp := &storekit.StoredResponse{
			Status:      int(*respStatus),
			Body:        respBody,
			NotRetained: notRetained,
		}
		if len(respHeader) > 0 {
			var h map[string][]string
			if err := json.Unmarshal(respHeader, &h); err != nil {
				return storekit.Record{}, fmt.Errorf("decode stored headers: %w", err)
			}
			resp.Header = h
		}
		r.Response = resp
	}
	return r, nil
}

// Heartbeat implements core.Store. One UPDATE.
func (s *Store) Heartbeat(ctx context.Context, f storekit.Fence, extend time.Duration) error {
	const op = "heartbeat"
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err)
	}
	if extend < time.Microsecond {
		return fmt.Errorf("pgstore: heartbeat: extension %v must be positive (at least 1µs)", extend)
	}
	tag, err := s.pool.Exec(ctx, s.sql.heartbeat, f.Scope, f.Key, f.Token, micros(extend))
	if err != nil {
		return wrap(ctx, op, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: heartbeat: %w", core.ErrLeaseLost)
	}
	return nil
}

// Complete implements core.Store: one fenced statement (UPDATE, or in
// partitioned mode an UPDATE plus the payload INSERT in one CTE).
//
// When ctx carries the lease for f and the handler ran statements in the
// transaction Tx gave it, the fenced statement runs inside that
// transaction, pipelined with its COMMIT (one round trip): the handler's
// writes and the stored response become one atomic fact. If the fence no
// longer matches, the statement raises, the transaction is rolled back (the
// handler's writes vanish) and ErrLeaseLost is returned.
func (s *Store) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	const op = "complete"
	if err := ctx.Err(); err != nil {
		s.abandonTx(ctx, f)
		return wrap(ctx, op, err)
	}
	if resp.Status < 100 || resp.Status > 999 {
		s.abandonTx(ctx, f)
		return fmt.Errorf("pgstore: complete: invalid response status %d", resp.Status)
	}
	args := completeArgs(f, resp)

	t, deferred := s.takeTx(ctx, f)
	if t != nil {
		return s.completeInTx(ctx, t, f, deferred, args)
	}
	return s.completeOutside(ctx, f, deferred, args)
}

// completeArgs are the arguments of the complete statements ($1–$7). The
// headers go as JSON text, cast to jsonb in the statement: a string is sent
// as text in every pgx QueryExecMode (a []byte would go as bytea where pgx
// picks types from Go's: QueryExecModeExec, the simple protocol). nil is
// NULL.
func completeArgs(f storekit.Fence, resp storekit.StoredResponse) []any {
	var header any
	if len(resp.Header) > 0 {
		header = headerJSON(resp.Header)
	}
	return []any{f.Scope, f.Key, f.Token, int32(resp.Status), header, resp.Body, resp.NotRetained}
}

// Fail implements core.Store. One UPDATE. A transaction begun by Tx for
// this lease is rolled back in the same round trip (one pipeline on its
// connection: ROLLBACK, then the fenced update).
func (s *Store) Fail(ctx context.Context, f storekit.Fence) error {
	const op = "fail"
	t, _ := s.takeTx(ctx, f)
	if err := ctx.Err(); err != nil {
		if t != nil {
			t.rollback(ctx)
		}
		return wrap(ctx, op, err)
	}
	var (
		matched, waiters bool
		err              error
	)
	if t != nil {
		matched, waiters, err = s.failInTx(ctx, t, f)
	} else {
		matched, waiters, err = fenced(ctx, s.pool, s.sql.fail, f.Scope, f.Key, f.Token)
	}
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !matched {
		return fmt.Errorf("pgstore: fail: %w", core.ErrLeaseLost)
	}
	if waiters {
		s.notify(ctx, f.Scope, f.Key)
	}
	return nil
}

// Get implements core.Store. One SELECT. An expired record is returned as
// stored, except in partitioned mode when its payload partition was already
// dropped: it is then reported as ErrNotFound, as if swept.
func (s *Store) Get(ctx context.Context, scope, key string) (storekit.Record, error) {
	const op = "get"
	if err := ctx.Err(); err != nil {
		return storekit.Record{}, wrap(ctx, op, err)
	}
	var (
		hasPayload bool
		now        time.Time
	)
	r, err := scanRecord(s.pool.QueryRow(ctx, s.sql.get, scope, key), &hasPayload, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return storekit.Record{}, fmt.Errorf("pgstore: get: %w", storekit.ErrNotFound)
	}
	if err != nil {
		return storekit.Record{}, wrap(ctx, op, err)
	}
	if r.Status == storekit.StatusCompleted && !hasPayload {
		// Only possible in partitioned mode: the payload's partition is
		// gone. That is legitimate only past retention.
		if !now.Before(r.ExpiresAt) {
			return storekit.Record{}, fmt.Errorf("pgstore: get: %w (expired, payload dropped)", storekit.ErrNotFound)
		}
		return storekit.Record{}, fmt.Errorf("pgstore: get: a completed record has no payload (payload partition dropped before expiry?)")
	}
	return r, nil
}
