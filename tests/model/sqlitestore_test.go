package model

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/sqlitestore"
)

// twoProcs is one SQLite file opened by two processes: two stores, each on
// its own *sql.DB, so that nothing in memory (the writer slot, the claim
// coalescing, the open lease transactions) is shared between them and only
// SQLite's file locks decide. Claims, Gets and Releases (an operator's
// idemctl) go to either at random; a lease's fenced calls go to the store
// that claimed it, except, in transactional mode, Complete and Fail, which
// go to the store Tx and Defer find through the lease (Unwrap: a).
//
// It is also the fault: Kill arms a cancellation, and the next call (or
// business write) runs on a context whose deadline passes a random
// fraction of a millisecond to a few milliseconds in, mid-statement or
// between statements. SQLite has no connection to kill; a request whose
// client hung up is its real fault.
type twoProcs struct {
	*sqlitestore.Store // a: promotes Inspect, Stuck, Stats, Sweep, Maintain, Watch
	b                  *sqlitestore.Store
	tx                 bool

	mu    sync.Mutex
	owner map[int64]*sqlitestore.Store

	armed     atomic.Int32
	cancelled atomic.Int32 // calls whose context ended before they returned
}

func (p *twoProcs) Unwrap() core.Store { return p.Store }

func (p *twoProcs) either() *sqlitestore.Store {
	if rand.IntN(3) == 0 {
		return p.b
	}
	return p.Store
}

func (p *twoProcs) of(f storekit.Fence) *sqlitestore.Store {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.owner[f.Token]; s != nil {
		return s
	}
	return p.Store
}

// finisher is the store a lease's Complete or Fail goes to.
func (p *twoProcs) finisher(f storekit.Fence) *sqlitestore.Store {
	if p.tx {
		return p.Store
	}
	return p.of(f)
}

// call returns the context a call runs on: ctx, or, when a cancellation is
// armed, ctx with a deadline 0 to 4ms away (most under 1ms).
func (p *twoProcs) call(ctx context.Context) (context.Context, func()) {
	if p.armed.Load() <= 0 || p.armed.Add(-1) < 0 {
		return ctx, func() {}
	}
	d := time.Duration(rand.Int64N(int64(time.Millisecond)))
	if rand.IntN(3) == 0 {
		d = time.Duration(rand.Int64N(int64(4 * time.Millisecond)))
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() {
		if ctx.Err() != nil {
			p.cancelled.Add(1)
		}
		cancel()
	}
}

func (p *twoProcs) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	ctx, done := p.call(ctx)
	defer done()
	s := p.either()
	res, err := s.Claim(ctx, req)
	if err == nil && res.Claimed {
		p.mu.Lock()
		p.owner[res.Record.Token] = s
		p.mu.Unlock()
	}
	return res, err
}

func (p *twoProcs) Get(ctx context.Context, scope, key string) (storekit.Record, error) {
	ctx, done := p.call(ctx)
	defer done()
	return p.either().Get(ctx, scope, key)
}

func (p *twoProcs) Release(ctx context.Context, f storekit.Fence, live bool) error {
	ctx, done := p.call(ctx)
	defer done()
	return p.either().Release(ctx, f, live)
}

func (p *twoProcs) Heartbeat(ctx context.Context, f storekit.Fence, extend time.Duration) error {
	ctx, done := p.call(ctx)
	defer done()
	return p.of(f).Heartbeat(ctx, f, extend)
}

func (p *twoProcs) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	ctx, done := p.call(ctx)
	defer done()
	return p.finisher(f).Complete(ctx, f, resp)
}

func (p *twoProcs) Fail(ctx context.Context, f storekit.Fence) error {
	ctx, done := p.call(ctx)
	defer done()
	return p.finisher(f).Fail(ctx, f)
}

func (p *twoProcs) SaveStep(ctx context.Context, f storekit.Fence, name string, result []byte) error {
	ctx, done := p.call(ctx)
	defer done()
	return p.of(f).SaveStep(ctx, f, name, result)
}

func (p *twoProcs) LoadSteps(ctx context.Context, f storekit.Fence) (map[string][]byte, error) {
	ctx, done := p.call(ctx)
	defer done()
	return p.of(f).LoadSteps(ctx, f)
}

// openSqlite opens path with sqlitestore.OpenDB, closed when t ends.
func openSqlite(t *testing.T, path string) *sql.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqlitestore.OpenDB(ctx, path)
	if err != nil {
		t.Fatalf("sqlitestore.OpenDB: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// sqliteEnvs migrates sqlitestore into a fresh file under t.TempDir() and
// returns the Env of each history (its own scope, one twoProcs). Lapse,
// Expire and Audit run on a third *sql.DB on the file (an operator's
// sqlite3 shell); Kill arms a cancellation (twoProcs).
//
// Transactional: every Complete and Fail comes after a ledger write in the
// lease's transaction (sqlitestore.Tx, or sqlitestore.Defer for even
// tokens whose handler does not end its transaction). The handler of every
// other lease (odd tokens) ends that transaction itself first: half of them
// with tx.Rollback (`defer tx.Rollback()`), half with ROLLBACK sent as SQL,
// which database/sql does not see (IDEM_MODEL_DEFER_ROLLBACK=0 never, =1
// always). Its Complete must not record the response
// (storekit.ErrNotCommitted). Some handlers commit the transaction
// themselves (CommitSelf): then the process crashes, and a takeover must
// complete the record as not retained; or the handler goes on, and idem's
// Complete records the response, its Fail completes the record as not
// retained.
func sqliteEnvs(t *testing.T, transactional bool) (func(h int) *Env, *twoProcs) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	dbA, dbB, admin := openSqlite(t, path), openSqlite(t, path), openSqlite(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sqlitestore.Migrate(ctx, dbA); err != nil {
		t.Fatalf("sqlitestore.Migrate: %v", err)
	}
	stores := [2]*sqlitestore.Store{}
	for i, db := range []*sql.DB{dbA, dbB} {
		s, err := sqlitestore.New(db)
		if err != nil {
			t.Fatalf("sqlitestore.New: %v", err)
		}
		t.Cleanup(s.Close) // before the db's Close (registered earlier)
		stores[i] = s
	}
	procs := &twoProcs{Store: stores[0], b: stores[1], tx: transactional, owner: map[int64]*sqlitestore.Store{}}
	if _, err := admin.ExecContext(ctx, "CREATE TABLE ledger (scope BLOB NOT NULL, key BLOB NOT NULL, token INTEGER NOT NULL)"); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	// A day before SQLite's clock (µs), as for the other stores.
	const dayAgo = "CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000 - 86400000000"
	lapse := func(set string) func(ctx context.Context, scope, key string) error {
		q := "UPDATE idem_records SET " + set + " WHERE scope = ? AND key = ?"
		return func(ctx context.Context, scope, key string) error {
			_, err := admin.ExecContext(ctx, q, []byte(scope), []byte(key))
			return err
		}
	}
	const insert = "INSERT INTO ledger (scope, key, token) VALUES (?, ?, ?)"
	endsTx := handlerEndsTx()
	business := func(ctx context.Context, f storekit.Fence) error {
		ctx, done := procs.call(ctx)
		defer done()
		if f.Token%2 == 0 && !endsTx(f) {
			// Half the leases queue the row with Defer: it commits with
			// the complete (or is dropped by Fail).
			return sqlitestore.Defer(ctx, insert, []byte(f.Scope), []byte(f.Key), f.Token)
		}
		tx, err := sqlitestore.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, insert, []byte(f.Scope), []byte(f.Key), f.Token)
		if !endsTx(f) {
			return err
		}
		// Input.Ended says the writes rolled back: a rollback that did not
		// happen fails the write (the runner then fails the lease). Not on
		// the cancellable context: database/sql sends nothing on a context
		// that ended, and the writes would commit with the response.
		var rerr error
		if f.Token%4 < 2 {
			rerr = tx.Rollback()
		} else {
			// Behind database/sql's back: the *sql.Tx looks open.
			_, rerr = tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		}
		return errors.Join(err, rerr)
	}
	commitSelf := func(ctx context.Context, f storekit.Fence) error {
		ctx, done := procs.call(ctx)
		defer done()
		tx, err := sqlitestore.Tx(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, insert, []byte(f.Scope), []byte(f.Key), f.Token); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	audit := func(ctx context.Context, scope, key string) ([]int64, error) {
		return ledgerTokens(admin.QueryContext(ctx, "SELECT token FROM ledger WHERE scope = ? AND key = ? ORDER BY token", []byte(scope), []byte(key)))
	}
	return func(h int) *Env {
		env := &Env{
			Store:  procs,
			Scope:  fmt.Sprintf("h%d", h),
			Lapse:  lapse("locked_until = " + dayAgo),
			Expire: lapse("locked_until = " + dayAgo + ", expires_at = " + dayAgo),
			Kill: func(context.Context) error {
				procs.armed.Add(1)
				return nil
			},
		}
		if transactional {
			env.BusinessWrite, env.HandlerEndsTx, env.Audit = business, endsTx, audit
			env.CommitSelf, env.CommitThenFinish = commitSelf, true
		}
		return env
	}, procs
}

func TestSqlitestore(t *testing.T) {
	t.Parallel()
	envs, procs := sqliteEnvs(t, false)
	sum, fails := Run(context.Background(), killConfig(t, 20), envs)
	Report(t, "sqlitestore", fails)
	covered(t, sum, true)
	t.Logf("%d calls cancelled mid-call", procs.cancelled.Load())
}

// TestSqlitestoreTransactional: Complete commits the handler's transaction
// (sqlitestore.Tx) with the response, Fail rolls it back; the ledger must
// hold a token exactly when its Complete took effect, or when its handler
// committed itself. Handlers that end their transaction themselves (see
// sqliteEnvs) must get no response recorded.
func TestSqlitestoreTransactional(t *testing.T) {
	t.Parallel()
	envs, procs := sqliteEnvs(t, true)
	sum, fails := Run(context.Background(), killConfig(t, 20), envs)
	Report(t, "sqlitestore-tx", fails)
	txCovered(t, sum)
	t.Logf("%d calls cancelled mid-call", procs.cancelled.Load())
}
