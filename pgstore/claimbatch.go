package pgstore

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// claimBatch gathers the bare inserts of WithInsertFirst's concurrent
// claims into one statement, as PostgreSQL gathers commits into one flush.
// A claim starts its insert at once while fewer than claimBatchRunning
// inserts are in flight; otherwise it queues, and the next statement
// carries everything queued (up to claimBatchMax). On a CPU-bound
// database most of a single-row insert's cost is per statement and per
// transaction, not per row (BENCHMARKS.md §4.000000), so a batch of n
// claims costs far less than n statements. A claim alone pays nothing.
//
// Each row is its own claim: ON CONFLICT DO NOTHING skips a row whose key
// exists and inserts the others, and the caller of a skipped row runs the
// claim function as before. The rows share one transaction, so they
// commit (or, on an error, fail) together; a failed batch sends each
// claim again on its own, so one claim's error is never another's.
type claimBatch struct {
	mu      sync.Mutex
	queue   []*pendingClaim
	running int
}

const (
	// claimBatchRunning bounds the batched inserts in flight: past it a
	// claim waits for a running insert to return, at most one statement.
	claimBatchRunning = 1
	// claimBatchMax bounds the rows of one statement.
	claimBatchMax = 64
)

// pendingClaim is one claim's insert and, once done is closed, its result.
type pendingClaim struct {
	ctx      context.Context
	req      *storekit.ClaimRequest
	done     chan struct{}
	cr       claimRow
	inserted bool
	err      error
	// alone: the batch failed; the claim must be sent on its own.
	alone bool
}

// claimNewBatched is claimNew, batched with concurrent claims (claimBatch).
func (s *Store) claimNewBatched(ctx context.Context, req *storekit.ClaimRequest) (claimRow, bool, error) {
	p := &pendingClaim{ctx: ctx, req: req, done: make(chan struct{})}
	b := &s.batch
	b.mu.Lock()
	if b.running < claimBatchRunning {
		b.running++
		b.mu.Unlock()
		s.runClaims([]*pendingClaim{p})
	} else {
		b.queue = append(b.queue, p)
		b.mu.Unlock()
		select {
		case <-p.done:
		case <-ctx.Done():
			if b.withdraw(p) {
				return claimRow{}, false, ctx.Err()
			}
			// Its statement is running: wait for the answer (bounded by the
			// batch's deadline) rather than leave a claim nobody owns.
			<-p.done
		}
	}
	if p.alone {
		return s.claimNew(ctx, req)
	}
	return p.cr, p.inserted, p.err
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

// runClaims sends batch's inserts, answers each claim, and then hands what
// queued meanwhile to a new statement (its own goroutine: the caller's
// request must not wait for other requests' claims) or, with nothing
// queued, frees the running slot.
func (s *Store) runClaims(batch []*pendingClaim) {
	if len(batch) == 1 {
		p := batch[0]
		p.cr, p.inserted, p.err = s.claimNew(p.ctx, p.req)
	} else {
		s.insertClaims(batch)
	}
	for _, p := range batch {
		close(p.done)
	}
	b := &s.batch
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
	go s.runClaims(next)
}

// insertClaims sends several claims' inserts in one statement (sql
// claimNews). A key sent twice is inserted once (DO NOTHING skips a row
// that conflicts with one the statement inserted): the other claim finds
// it existing, as it would one statement later. The statement runs
// under none of the requests' cancellations, only under the shortest
// lease as its deadline: a claim that takes longer has lapsed anyway.
func (s *Store) insertClaims(batch []*pendingClaim) {
	slices.SortStableFunc(batch, func(a, b *pendingClaim) int {
		return cmp.Or(cmp.Compare(a.req.Scope, b.req.Scope), cmp.Compare(a.req.Key, b.req.Key))
	})
	var (
		n                                     = len(batch)
		scopes, keys, methods, routes, prints = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		leases, retentions                    = make([]int64, 0, n), make([]int64, 0, n)
		deadline                              = batch[0].req.Lease
	)
	for _, p := range batch {
		r := p.req
		scopes, keys, methods, routes, prints = append(scopes, r.Scope), append(keys, r.Key),
			append(methods, r.Method), append(routes, r.Route), append(prints, r.Fingerprint)
		leases, retentions = append(leases, micros(r.Lease)), append(retentions, micros(r.Retention))
		deadline = min(deadline, r.Lease)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), max(deadline, time.Second))
	defer cancel()
	rows, err := s.pool.Query(ctx, s.sql.claimNews, scopes, keys, methods, routes, prints, leases, retentions)
	if err == nil {
		defer rows.Close()
		// Rows come back in no promised order: match them by key.
		for rows.Next() {
			var (
				scope, key string
				cr         claimRow
				r          = &cr.rec
			)
			if err = rows.Scan(&scope, &key, &r.Token, &r.LockedUntil, &r.CreatedAt, &r.ExpiresAt, &cr.now); err != nil {
				break
			}
			j, found := slices.BinarySearchFunc(batch, [2]string{scope, key}, func(p *pendingClaim, k [2]string) int {
				return cmp.Or(cmp.Compare(p.req.Scope, k[0]), cmp.Compare(p.req.Key, k[1]))
			})
			if !found || batch[j].inserted {
				err = errors.New("claim batch returned a key it was not sent")
				break
			}
			p := batch[j]
			r.Scope, r.Key, r.Method, r.Route, r.Fingerprint = p.req.Scope, p.req.Key, p.req.Method, p.req.Route, p.req.Fingerprint
			r.Status = storekit.StatusProcessing
			cr.claimed, cr.created = true, true
			p.cr, p.inserted = cr, true
		}
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		for _, p := range batch {
			p.cr, p.inserted, p.alone = claimRow{}, false, true
		}
	}
}
