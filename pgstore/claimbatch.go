package pgstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
)

// A claim's batcher (batch.go) for each kind of claim statement, unless
// WithoutBatching: the claim function's calls into one call per row (sql
// claimFns), and in transactional mode the bare inserts into one
// multi-row insert (sql claimNews; in plain mode they ride in the writes'
// pipeline, below). On a CPU-bound database most of a claim's cost is per
// statement and per transaction, not per row (BENCHMARKS.md §3, scripts/pgfloor.sh), so
// n claims in one statement cost far less than n statements.
//
// Each row is its own claim: the insert's ON CONFLICT DO NOTHING skips a
// row whose key exists (its caller calls the function, as before), and
// each function call claims or reads one key, seeing the rows before it.
// Rows are sorted by (scope, key), so two statements wait for each other's
// keys in one order and cannot deadlock. The rows share one transaction:
// they commit together, or fail together, and a failed statement sends
// each of its claims again on its own, so one claim's error is never
// another's.
type claimBatch = batcher[*pendingClaim]

// pendingClaim is one claim and, once answered, its answer.
type pendingClaim struct {
	pendingBase
	req      *storekit.ClaimRequest
	cr       claimRow
	inserted bool // the insert created the record (claimNews)
}

func (s *Store) initBatches() {
	s.inserts = claimBatch{
		send: s.insertClaims,
		alone: func(p *pendingClaim) {
			p.cr, p.inserted, p.err = s.claimNew(p.ctx, p.req)
		},
	}
	s.calls = claimBatch{
		send: s.callClaims,
		alone: func(p *pendingClaim) {
			p.cr, p.err = s.claimFn(p.ctx, p.req)
		},
	}
	s.writes = writeBatch{
		send:  s.sendWrites,
		alone: func(p pendingWrite) { p.runAlone(s) },
	}
	s.inserts.start(s.cfg.batchLimit, rttTolerance)
	s.calls.start(s.cfg.batchLimit, callsTolerance)
	s.writes.start(s.cfg.batchLimit, rttTolerance)
}

// claimNewBatched is claimNew, batched with concurrent claims when the
// store batches claims.
func (s *Store) claimNewBatched(ctx context.Context, req *storekit.ClaimRequest) (claimRow, bool, error) {
	if !s.cfg.batching {
		return s.claimNew(ctx, req)
	}
	p := &pendingClaim{pendingBase: pendingBase{scope: req.Scope, key: req.Key}, req: req}
	if s.cfg.transactional {
		// Its claims commit asynchronously (sql asyncCTE): in a
		// transaction with steps and completes they could make those
		// commit so too.
		s.inserts.do(ctx, p)
	} else {
		s.writes.do(ctx, p)
	}
	return p.cr, p.inserted, p.err
}

// A new key's insert rides in the writes' pipeline (writebatch.go) in
// plain mode: one transaction and one commit for the claims, steps and
// completes of concurrent requests, where claims in a statement of their
// own cost a second commit (BENCHMARKS.md §3).

func (p *pendingClaim) queue(s *Store, b *pgx.Batch) {
	r := p.req
	b.Queue(s.sql.claimNew, r.Scope, r.Key, r.Method, r.Route, r.Fingerprint, micros(r.Lease), micros(r.Retention))
}

func (p *pendingClaim) read(br pgx.BatchResults) error {
	var err error
	p.cr, p.inserted, err = scanClaimNew(br.QueryRow(), p.req)
	return err
}

func (p *pendingClaim) runAlone(s *Store) {
	p.cr, p.inserted, p.err = s.claimNew(p.ctx, p.req)
}

// claimFnBatched is claimFn, batched with concurrent claims when the store
// batches claims and its pool gets binary results (the text form stays one
// call per statement).
func (s *Store) claimFnBatched(ctx context.Context, req *storekit.ClaimRequest) (claimRow, error) {
	if !s.cfg.batching || !s.binaryClaim {
		return s.claimFn(ctx, req)
	}
	p := &pendingClaim{pendingBase: pendingBase{scope: req.Scope, key: req.Key}, req: req}
	s.calls.do(ctx, p)
	return p.cr, p.err
}

// batchArgs returns the statement's arrays and context: it runs under none
// of the requests' cancellations, only under the shortest lease as its
// deadline (a claim that takes longer has lapsed anyway).
func batchArgs(batch []*pendingClaim) (context.Context, context.CancelFunc, []any) {
	var (
		n                                     = len(batch)
		scopes, keys, methods, routes, prints = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		leases, retentions                    = make([]int64, n), make([]int64, n)
		deadline                              = batch[0].req.Lease
	)
	for i, p := range batch {
		r := p.req
		scopes[i], keys[i], methods[i], routes[i], prints[i] = r.Scope, r.Key, r.Method, r.Route, r.Fingerprint
		leases[i], retentions[i] = micros(r.Lease), micros(r.Retention)
		deadline = min(deadline, r.Lease)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), max(deadline, time.Second))
	return ctx, cancel, []any{scopes, keys, methods, routes, prints, leases, retentions}
}

// insertClaims sends several claims' inserts in one statement (sql
// claimNews). A key sent twice is inserted once (DO NOTHING skips a row
// that conflicts with one the statement inserted): the other claim finds
// it existing, as it would one statement later.
func (s *Store) insertClaims(batch []*pendingClaim) error {
	ctx, cancel, args := batchArgs(batch)
	defer cancel()
	rows, err := s.pool.Query(ctx, s.sql.claimNews, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() { // in no promised order: matched by key
		var (
			scope, key string
			cr         claimRow
			r          = &cr.rec
		)
		if err := rows.Scan(&scope, &key, &r.Token, &r.LockedUntil, &r.CreatedAt, &r.ExpiresAt, &cr.now); err != nil {
			return err
		}
		j, found := slices.BinarySearchFunc(batch, [2]string{scope, key}, func(p *pendingClaim, k [2]string) int {
			return cmp.Or(cmp.Compare(p.req.Scope, k[0]), cmp.Compare(p.req.Key, k[1]))
		})
		if !found || batch[j].inserted {
			return errors.New("claim batch returned a key it was not sent")
		}
		p := batch[j]
		r.Scope, r.Key, r.Method, r.Route, r.Fingerprint = p.req.Scope, p.req.Key, p.req.Method, p.req.Route, p.req.Fingerprint
		r.Status = storekit.StatusProcessing
		cr.claimed, cr.created = true, true
		p.cr, p.inserted = cr, true
	}
	return rows.Err()
}

// callClaims calls the claim function once per claim in one statement
// (sql claimFns): each row is the claim's position in the sorted batch
// and the function's composite, decoded as claimFn decodes it.
func (s *Store) callClaims(batch []*pendingClaim) error {
	ctx, cancel, args := batchArgs(batch)
	defer cancel()
	rows, err := s.pool.Query(ctx, s.sql.claimFns, append([]any{claimsResultFormat}, args...)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	answered := 0
	for rows.Next() {
		v := rows.RawValues()
		if len(v) != 2 || len(v[0]) != 8 {
			return errors.New("claim batch returned an unexpected row")
		}
		if fd := rows.FieldDescriptions(); fd[1].Format != pgx.BinaryFormatCode {
			return errors.New("claim batch's result came back as text, not binary")
		}
		i := int64(binary.BigEndian.Uint64(v[0])) - 1 // WITH ORDINALITY counts from 1
		if i < 0 || i >= int64(len(batch)) || !batch[i].cr.now.IsZero() {
			return fmt.Errorf("claim batch returned row %d of %d", i+1, len(batch))
		}
		cr, err := decodeClaimRow(v[1], batch[i].req)
		if err != nil {
			return err
		}
		batch[i].cr = cr
		answered++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if answered != len(batch) {
		return fmt.Errorf("claim batch answered %d of %d claims", answered, len(batch))
	}
	return nil
}

// claimsResultFormat: the position (int8) and the composite, both binary.
var claimsResultFormat = pgx.QueryResultFormats{pgx.BinaryFormatCode, pgx.BinaryFormatCode}
