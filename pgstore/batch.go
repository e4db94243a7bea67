package pgstore

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// batcher gathers the statements of concurrent requests into one, as
// PostgreSQL gathers commits into one flush (claimbatch.go,
// writebatch.go). A request sends its statement at once
// while fewer than limit statements of its kind are in flight; otherwise it
// queues, and the next statement carries everything queued (up to
// batchMax). A request alone pays nothing; one that queues waits for at
// most one statement in flight. Each statement's requests are its own
// (claimbatch.go and completebatch.go say how a shared one stays fenced).
//
// The limit adapts to what statements take, as TCP Vegas and Netflix's
// gradient limiter do: while statements take, on average, less than twice
// the fastest of late (a database a round trip away, or idle), they are
// not waiting on each other in the database, so more go in flight, up to
// limitMax, and nobody queues: as fast as each request alone. When they
// take longer (a database whose CPU is the bottleneck, or a pool
// exhausted), fewer go in flight and more requests share each: fewer
// statements and commits for the same work.
type batcher[P batchItem] struct {
	mu      sync.Mutex
	queue   []P
	running int
	limit   float64       // statements of this kind let in flight: its floor, >= 1
	fixed   bool          // limit pinned (withBatchLimit), not adapted
	tol     float64       // rttTolerance or callsTolerance
	rtt     minWindow     // the fastest statements of late
	avg     time.Duration // what statements take of late (moving average)
	failed  int           // statements that failed, their requests sent one by one
	// send runs one statement for batch (two or more requests, sorted by
	// (scope, key)) and sets each one's answer; an error sends each again
	// alone. alone runs one request's own statement.
	send  func(batch []P) error
	alone func(p P)
}

const (
	// batchMax bounds the requests of one statement.
	batchMax = 64
	// limitMax bounds the statements of a kind in flight, and is where the
	// limit starts: as if each request were sent alone.
	limitMax = 64
	// rttTolerance: a statement up to this many times the fastest of late
	// counts as not delayed (jitter, a bigger batch, a busy client host).
	rttTolerance = 2.0
	// callsTolerance is rttTolerance for the claim function's calls, which
	// at a high duplicate rate mostly read: sharing one saves a statement
	// but no commit flush, so requests queue for it only when statements
	// wait longer. At twice the fastest (a database 2 ms away on a busy
	// host, 90 % duplicates) the few replays that queued waited a whole
	// statement each, 0.95× sending each alone (BENCHMARKS.md §4).
	callsTolerance = 3.0
	// limitHeadroom: what the limit grows by at a gradient of 1.
	limitHeadroom = 0.5
	// limitSmoothing: the share of each new estimate in the limit.
	limitSmoothing = 0.2
	// avgWeight: each statement is 1/avgWeight of the moving average the
	// gradient judges, so that an occasional slow one (a busy host, a
	// checkpoint) does not make requests queue where statements are not
	// waiting on each other (BENCHMARKS.md §4).
	avgWeight = 8
)

// adapt moves the limit after a statement that took took (b.mu held), as
// Netflix's gradient limiter does: limit × gradient + ½, the gradient being
// how much slower than twice the fastest of late (three times for the
// claim function's calls) statements are now, on average over the last
// eight or so. At rest the limit is ½/(1-gradient): one in flight (every
// other request queues) while statements take about three times the
// fastest or more (five for the calls), which is where a database whose
// CPU is the bottleneck sits; limitMax while they take less than twice the
// fastest (a database a round trip away, or idle). The constants are the
// measured ones (BENCHMARKS.md §3, §4).
func (b *batcher[P]) adapt(took time.Duration) {
	fastest := b.rtt.add(took)
	if b.fixed {
		return
	}
	if b.avg == 0 {
		b.avg = took
	}
	b.avg += (took - b.avg) / avgWeight
	gradient := min(1, b.tol*float64(fastest)/float64(max(b.avg, 1)))
	next := b.limit*gradient + limitHeadroom
	b.limit = min(limitMax, max(1, b.limit*(1-limitSmoothing)+next*limitSmoothing))
}

// minWindow is the minimum of the last 2×minWindowSize samples or so: two
// buckets, the older dropped when the newer fills.
type minWindow struct {
	cur, prev time.Duration
	n         int
}

const minWindowSize = 256

func (w *minWindow) add(d time.Duration) time.Duration {
	if w.n == 0 || d < w.cur {
		w.cur = d
	}
	if w.n++; w.n == minWindowSize {
		w.prev, w.n = w.cur, 0
	}
	if w.prev > 0 && w.prev < w.cur {
		return w.prev
	}
	return w.cur
}

// batchItem is a request of a batcher: a pointer to a struct embedding
// pendingBase.
type batchItem interface{ base() *pendingBase }

// pendingBase is what every batched request has: its record's scope and
// key (a batch is sent in their order), its context, its error, and done,
// closed once it is answered.
type pendingBase struct {
	scope, key string
	ctx        context.Context
	err        error
	done       chan struct{}
}

func (p *pendingBase) base() *pendingBase { return p }

// do sends p's statement now, or queues p for the next one, and returns
// once p is answered: true; false when ctx withdrew p from the queue
// before a statement took it (p's error is then ctx's).
func (b *batcher[P]) do(ctx context.Context, p P) bool {
	pb := p.base()
	pb.ctx, pb.done = ctx, make(chan struct{})
	b.mu.Lock()
	if b.running < int(b.limit) {
		b.running++
		// What queued before a larger limit let p through goes with it.
		n := min(len(b.queue), batchMax-1)
		batch := append(slices.Clone(b.queue[:n]), p)
		b.queue = slices.Delete(b.queue, 0, n)
		b.mu.Unlock()
		b.run(batch)
		return true
	}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	select {
	case <-pb.done:
	case <-ctx.Done():
		if b.withdraw(p) {
			pb.err = ctx.Err()
			return false
		}
		// Its statement is running: wait for the answer (bounded by the
		// statement's deadline) rather than leave a request half done.
		<-pb.done
	}
	return true
}

// withdraw removes p from the queue; false if a statement already took it.
func (b *batcher[P]) withdraw(p P) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, q := range b.queue {
		if q.base() == p.base() {
			b.queue = slices.Delete(b.queue, i, i+1)
			return true
		}
	}
	return false
}

// run sends batch's statement, answers each request, and then hands what
// queued meanwhile to a new statement (its own goroutine: the caller's
// request must not wait for other requests) or, with nothing queued, frees
// the running slot.
func (b *batcher[P]) run(batch []P) {
	began := time.Now()
	if len(batch) == 1 {
		b.alone(batch[0])
	} else if err := b.send(sortByKey(batch)); err != nil {
		// Each on its own: one request's bad row must not fail the
		// others. A statement that failed after its commit leaves rows the
		// retries find existing, as any statement whose answer was lost.
		b.mu.Lock()
		b.failed++
		b.mu.Unlock()
		var wg sync.WaitGroup
		for _, p := range batch {
			p.base().err = nil
			wg.Go(func() { b.alone(p) })
		}
		wg.Wait()
	}
	took := time.Since(began)
	for _, p := range batch {
		close(p.base().done)
	}
	b.mu.Lock()
	b.adapt(took)
	if len(b.queue) == 0 {
		b.running--
		b.mu.Unlock()
		return
	}
	n := min(len(b.queue), batchMax)
	next := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	b.mu.Unlock()
	go b.run(next)
}

// sortByKey sorts batch by (scope, key), the order send gets it in: two
// statements take their row locks in one order and cannot deadlock.
func sortByKey[P batchItem](batch []P) []P {
	slices.SortStableFunc(batch, func(a, b P) int {
		x, y := a.base(), b.base()
		return cmp.Or(cmp.Compare(x.scope, y.scope), cmp.Compare(x.key, y.key))
	})
	return batch
}

// batchContext is a batch's context: none of its requests' cancellations,
// and the latest of their deadlines (each request waits for its answer;
// none is left with a statement it cannot know the end of).
func batchContext[P batchItem](batch []P) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].base().ctx)
	var latest time.Time
	for _, p := range batch {
		d, ok := p.base().ctx.Deadline()
		if !ok {
			return context.WithCancel(ctx)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}

// sharingLimit: below this many statements of a kind in flight, most
// requests queue and share statements (a database whose CPU is the limit);
// a database a round trip away or idle keeps the limit at 35–64
// (BENCHMARKS.md §4).
const sharingLimit = 8

// sharing reports whether the limit has fallen to where requests share
// statements.
func (b *batcher[P]) sharing() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limit < sharingLimit
}

// start sets the limit: n statements in flight (tests), or adaptive from
// limitMax (n = 0) with tolerance tol (rttTolerance, callsTolerance).
func (b *batcher[P]) start(n int, tol float64) {
	b.limit, b.fixed, b.tol = float64(n), n > 0, tol
	if n == 0 {
		b.limit = limitMax
	}
}
