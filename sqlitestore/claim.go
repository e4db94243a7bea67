package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
)

// Claim implements core.Store. A plain read first (WAL readers never wait
// for the writer): a record that is not claimable is the answer, so
// replays, in-flight duplicates and wait-mode polls take no write lock.
// Otherwise one write transaction: its first statement draws a token, which
// takes SQLite's write lock (waiting up to busy_timeout), then it reads the
// clock and the record again, decides with the claim rule and upserts. No
// other writer, in this process or another, can run in between, so the
// decision holds when it commits.
func (s *Store) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	const op = "claim"
	if err := ctx.Err(); err != nil {
		return storekit.ClaimResult{}, wrap(ctx, op, err)
	}
	if err := sqlkit.ValidClaim(&req); err != nil {
		return storekit.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	if !s.schemaOK.Load() {
		if err := s.checkSchema(ctx); err != nil {
			return storekit.ClaimResult{}, err
		}
	}
	st, err := s.stmt(ctx, s.sql.get)
	if err != nil {
		return storekit.ClaimResult{}, wrap(ctx, op, err)
	}
	res, found, err := readClaim(ctx, st, &req)
	if err != nil {
		return storekit.ClaimResult{}, wrap(ctx, op, err)
	}
	if found && !sqlkit.Claimable(&res.Record, res.Now, &req) {
		return res, nil
	}
	// Concurrent duplicates of a new key all miss the first read. One of
	// them per key goes on to write; the others wait for it, then read
	// again (reads run side by side), instead of queueing for the writer
	// slot one by one, where the owner's Complete waited behind them.
	for {
		other, release := s.claiming(req.Scope, req.Key)
		if release != nil {
			defer release()
			break
		}
		select {
		case <-other:
		case <-ctx.Done():
			return storekit.ClaimResult{}, wrap(ctx, op, ctx.Err())
		}
		if res, found, err = readClaim(ctx, st, &req); err != nil {
			return storekit.ClaimResult{}, wrap(ctx, op, err)
		}
		if found && !sqlkit.Claimable(&res.Record, res.Now, &req) {
			return res, nil
		}
	}
	var changed bool
	err = s.wr.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		res, changed, err = s.claimWrite(ctx, tx, &req)
		if err == nil && !changed {
			return errDiscard // nothing to keep
		}
		return err
	})
	if err != nil {
		return storekit.ClaimResult{}, wrap(ctx, op, err)
	}
	if changed {
		s.watch.notify(req.Scope, req.Key)
	}
	return res, nil
}

// readClaim reads the record and the clock with st (the get statement,
// possibly bound to a transaction).
func readClaim(ctx context.Context, st *sql.Stmt, req *storekit.ClaimRequest) (storekit.ClaimResult, bool, error) {
	var now int64
	rec, err := scanRecord(st.QueryRowContext(ctx, b(req.Scope), b(req.Key)), &now)
	if errors.Is(err, sql.ErrNoRows) {
		return storekit.ClaimResult{}, false, nil
	}
	if err != nil {
		return storekit.ClaimResult{}, false, err
	}
	rec.Scope, rec.Key = req.Scope, req.Key
	return storekit.ClaimResult{Record: rec, Now: fromMicros(now)}, true, nil
}

// claimWrite is the claim's write, in tx. changed reports a change to
// keep: a claim, or a completion by commit mark (otherwise tx holds only
// the token draw, which the caller rolls back). The caller holds the
// writer slot.
func (s *Store) claimWrite(ctx context.Context, tx *sql.Tx, req *storekit.ClaimRequest) (res storekit.ClaimResult, changed bool, err error) {
	st, err := s.inTx(ctx, tx, s.sql.drawToken)
	if err != nil {
		return res, false, err
	}
	var tok int64
	if err := st.QueryRowContext(ctx).Scan(&tok); err != nil {
		return res, false, fmt.Errorf("draw token: %w", err)
	}
	if st, err = s.inTx(ctx, tx, s.sql.now); err != nil {
		return res, false, err
	}
	var now int64
	if err := st.QueryRowContext(ctx).Scan(&now); err != nil {
		return res, false, err
	}
	if st, err = s.inTx(ctx, tx, s.sql.get); err != nil {
		return res, false, err
	}
	cur, found, err := readClaim(ctx, st, req)
	if err != nil {
		return res, false, err
	}
	res.Now = fromMicros(now)
	if found && !sqlkit.Claimable(&cur.Record, res.Now, req) {
		res.Record = cur.Record
		return res, false, nil
	}
	rec := cur.Record
	newAgain := !found || !rec.ExpiresAt.After(res.Now) // claimable and past retention: the key is new again
	if !newAgain && rec.Status == storekit.StatusProcessing {
		// Taking over a lapsed lease: if its handler committed the lease
		// transaction itself and died before Complete (its commit mark is
		// there), its writes landed. Running the handler again would
		// repeat them; complete the record as not retained instead.
		done, err := s.completeByMark(ctx, tx, req, &rec, now)
		if err != nil || done {
			res.Record = rec
			return res, err == nil, err
		}
	}
	created := rec.CreatedAt.UnixMicro()
	if newAgain {
		created = now
	}
	if st, err = s.inTx(ctx, tx, s.sql.upsert); err != nil {
		return res, false, err
	}
	lockedUntil, expires := now+micros(req.Lease), now+micros(req.Retention)
	if _, err := st.ExecContext(ctx, b(req.Scope), b(req.Key), b(req.Method), b(req.Route), b(req.Fingerprint),
		tok, lockedUntil, created, expires); err != nil {
		return res, false, fmt.Errorf("upsert: %w", err)
	}
	res.Claimed, res.Fresh = true, newAgain
	res.Record = storekit.Record{
		Scope: req.Scope, Key: req.Key, Method: req.Method, Route: req.Route, Fingerprint: req.Fingerprint,
		Status: storekit.StatusProcessing, Token: tok, LockedUntil: fromMicros(lockedUntil),
		CreatedAt: fromMicros(created), ExpiresAt: fromMicros(expires),
	}
	return res, true, nil
}

// completeByMark completes rec (a processing record under a lapsed lease)
// as not retained when its owner's commit mark is present, in tx, and
// reports whether it did.
func (s *Store) completeByMark(ctx context.Context, tx *sql.Tx, req *storekit.ClaimRequest, rec *storekit.Record, now int64) (bool, error) {
	st, err := s.inTx(ctx, tx, s.sql.markRead)
	if err != nil {
		return false, err
	}
	var n int
	if err := st.QueryRowContext(ctx, rec.Token).Scan(&n); err != nil {
		return false, fmt.Errorf("read commit mark: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	if st, err = s.inTx(ctx, tx, s.sql.markClaim); err != nil {
		return false, err
	}
	if _, err := st.ExecContext(ctx, now, b(req.Scope), b(req.Key), rec.Token); err != nil {
		return false, fmt.Errorf("complete by commit mark: %w", err)
	}
	rec.Status = storekit.StatusCompleted
	rec.Response = &storekit.StoredResponse{Status: 500, Body: []byte{}, NotRetained: true}
	return true, nil
}

// claiming registers the caller as the goroutine of this Store claiming
// (scope, key) on the write path (release non-nil: call it when done), or
// returns a channel that closes when the claim already in progress returns.
func (s *Store) claiming(scope, key string) (other <-chan struct{}, release func()) {
	k := watchKey{scope, key}
	s.cmu.Lock()
	defer s.cmu.Unlock()
	if ch, ok := s.claims[k]; ok {
		return ch, nil
	}
	ch := make(chan struct{})
	s.claims[k] = ch
	return nil, func() {
		s.cmu.Lock()
		delete(s.claims, k)
		s.cmu.Unlock()
		close(ch)
	}
}
