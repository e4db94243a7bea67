package pgstore

import "github.com/jackc/pgx/v5"

// writeBatch (unless WithoutBatching) gathers the steps and the completes
// of concurrent requests without a Tx, and in plain mode the new keys'
// inserts (Claim), into one pipeline, and so into one implicit
// transaction and one synchronous commit, as PostgreSQL gathers commits
// into one flush: a step or a claim rides with the completes of other
// requests rather than paying a round trip and a commit of its own. Each
// is its own statement (stepbatch.go, completebatch.go, claimbatch.go say
// how), sent in (scope, key) order: two pipelines take their row locks in
// one order and cannot deadlock, with each other or with a claim batch.
//
// On a CPU-bound database a transaction's cost is mostly per round trip
// and per commit, not per statement (BENCHMARKS.md §3, scripts/pgfloor.sh),
// so n writes in one transaction cost far less than n. A request's writes
// and its response still commit together or not at all; the writes of one
// pipeline commit together, or roll back together. A step whose fence
// matches nothing answers ErrLeaseLost without failing the others;
// anything that fails the pipeline (a complete's fence, which raises, a
// deferred statement's constraint) sends each of its writes again alone,
// so one request's error is never another's. That is safe even when the
// failure hid a commit (the connection died after it): a step saved again
// writes the same row, and each request's deferred statements travel with
// its fenced complete, which then matches nothing (the record is
// completed) and rolls them back, so nothing runs twice; that request is
// answered ErrLeaseLost, and a retry replays the stored response.
type writeBatch = batcher[pendingWrite]

// pendingWrite is a step (*pendingStep) or a complete (*pendingComplete).
type pendingWrite interface {
	batchItem
	// queue adds its statements to a pipeline; read takes their results
	// from it, in the same order.
	queue(s *Store, b *pgx.Batch)
	read(br pgx.BatchResults) error
	// runAlone sends its statements on their own and sets its answer.
	runAlone(s *Store)
}

// sendWrites sends batch's writes in one pipeline and sets each one's
// answer; its error sends each again alone.
func (s *Store) sendWrites(batch []pendingWrite) error {
	ctx, cancel := batchContext(batch)
	defer cancel()
	b := &pgx.Batch{}
	for _, p := range batch {
		p.queue(s, b)
	}
	br := s.pool.SendBatch(ctx, b)
	var err error
	for _, p := range batch {
		if err = p.read(br); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}
