package pgstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
)

// claimBatch (WithClaimBatching) gathers the claim statements of
// concurrent claims into one statement, as PostgreSQL gathers commits into
// one flush:
// the bare inserts into one multi-row insert (sql claimNews), the claim
// function's calls into one call per row (sql claimFns). A claim sends its
// statement at once while fewer than claimBatchRunning of its kind are in
// flight; otherwise it queues, and the next statement carries everything
// queued (up to claimBatchMax). On a CPU-bound database most of a claim's
// cost is per statement and per transaction, not per row (BENCHMARKS.md
// §4.000000), so n claims in one statement cost far less than n
// statements. A claim alone pays nothing; one that queues waits for at
// most one statement in flight.
//
// Each row is its own claim: the insert's ON CONFLICT DO NOTHING skips a
// row whose key exists (its caller calls the function, as before), and
// each function call claims or reads one key, seeing the rows before it.
// Rows are sorted by (scope, key), so two statements wait for each other's
// keys in one order and cannot deadlock. The rows share one transaction:
// they commit together, or fail together, and a failed statement sends
// each of its claims again on its own, so one claim's error is never
// another's.
type claimBatch struct {
	mu      sync.Mutex
	queue   []*pendingClaim
	running int
	failed  int // statements that failed, their claims sent one by one
	// send runs a statement for batch (two or more claims) and sets each
	// claim's answer; alone runs one claim's own statement.
	send  func(batch []*pendingClaim) error
	alone func(p *pendingClaim)
}

const (
	// claimBatchRunning bounds the statements of a kind in flight.
	claimBatchRunning = 1
	// claimBatchMax bounds the rows of one statement.
	claimBatchMax = 64
)

// pendingClaim is one claim and, once done is closed, its answer.
type pendingClaim struct {
	ctx      context.Context
	req      *storekit.ClaimRequest
	done     chan struct{}
	cr       claimRow
	inserted bool // the insert created the record (claimNews)
	err      error
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
}

// claimNewBatched is claimNew, batched with concurrent claims when the
// store batches claims.
func (s *Store) claimNewBatched(ctx context.Context, req *storekit.ClaimRequest) (claimRow, bool, error) {
	if !s.cfg.batchClaims {
		return s.claimNew(ctx, req)
	}
	p := s.inserts.claim(ctx, req)
	return p.cr, p.inserted, p.err
}

// claimFnBatched is claimFn, batched with concurrent claims when the store
// batches claims and its pool gets binary results (the text form stays one
// call per statement).
func (s *Store) claimFnBatched(ctx context.Context, req *storekit.ClaimRequest) (claimRow, error) {
	if !s.cfg.batchClaims || !s.binaryClaim {
		return s.claimFn(ctx, req)
	}
	p := s.calls.claim(ctx, req)
	return p.cr, p.err
}

// claim sends req's statement now, or queues it for the next one.
func (b *claimBatch) claim(ctx context.Context, req *storekit.ClaimRequest) *pendingClaim {
	p := &pendingClaim{ctx: ctx, req: req, done: make(chan struct{})}
	b.mu.Lock()
	if b.running < claimBatchRunning {
		b.running++
		b.mu.Unlock()
		b.run([]*pendingClaim{p})
		return p
	}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	select {
	case <-p.done:
	case <-ctx.Done():
		if b.withdraw(p) {
			p.err = ctx.Err()
			return p
		}
		// Its statement is running: wait for the answer (bounded by the
		// statement's deadline) rather than leave a claim nobody owns.
		<-p.done
	}
	return p
}

// withdraw removes p from the queue; false if a statement already took it.
func (b *claimBatch) withdraw(p *pendingClaim) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, q := range b.queue {
		if q == p {
			b.queue = slices.Delete(b.queue, i, i+1)
			return true
		}
	}
	return false
}

// run sends batch's statement, answers each claim, and then hands what
// queued meanwhile to a new statement (its own goroutine: the caller's
// request must not wait for other requests' claims) or, with nothing
// queued, frees the running slot.
func (b *claimBatch) run(batch []*pendingClaim) {
	if len(batch) == 1 {
		b.alone(batch[0])
	} else if err := b.send(batch); err != nil {
		// Each on its own: one claim's bad row must not fail the others.
		// A statement that failed after its commit leaves rows the
		// retries find existing, as any claim whose answer was lost.
		b.mu.Lock()
		b.failed++
		b.mu.Unlock()
		var wg sync.WaitGroup
		for _, p := range batch {
			p.cr, p.inserted, p.err = claimRow{}, false, nil
			wg.Go(func() { b.alone(p) })
		}
		wg.Wait()
	}
	for _, p := range batch {
		close(p.done)
	}
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.running--
		b.mu.Unlock()
		return
	}
	n := min(len(b.queue), claimBatchMax)
	next := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	b.mu.Unlock()
	go b.run(next)
}

// batchArgs sorts batch by (scope, key) and returns the statement's
// arrays and context: it runs under none of the requests' cancellations,
// only under the shortest lease as its deadline (a claim that takes longer
// has lapsed anyway).
func batchArgs(batch []*pendingClaim) (context.Context, context.CancelFunc, []any) {
	slices.SortStableFunc(batch, func(a, b *pendingClaim) int {
		return cmp.Or(cmp.Compare(a.req.Scope, b.req.Scope), cmp.Compare(a.req.Key, b.req.Key))
	})
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
