package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// memLedger is the in-memory ledger of -dsn mem: (memstore): a
// mutex-protected slice.
//
// Its writes follow the idem record, like pgstore's transactional mode does
// in PostgreSQL, as far as memory allows: Record does not touch the slice,
// it parks the row on the execution's lease; the store wrapper (ledgerStore)
// appends it only after memstore has completed the record — that is, only
// if the fenced Commit succeeded. A handler whose commit fails (lease lost
// to a takeover), that answers 5xx, or that panics leaves no row.
//
// The limit: the record and the row are two writes under two locks, not one
// atomic fact. For an instant after a commit, a replay can be served while
// GET /v1/payments does not show the row yet. Both live in this process's
// memory, so a crash loses them together; there is no half-written state to
// recover. The default (a SQLite file) and the other -dsn stores keep the
// row and the record in one transaction.
type memLedger struct {
	mu   sync.Mutex
	rows []ledgerRow
	byID map[string]bool
}

type ledgerRow struct {
	user string
	p    Payment
}

func newMemLedger() *memLedger { return &memLedger{byID: make(map[string]bool)} }

// pendingKey is the lease attachment holding rows waiting for the commit.
type pendingKey struct{}

type pending struct {
	mu   sync.Mutex
	rows []ledgerRow
}

var errNoLease = errors.New("ledger: no idem lease in context: Record must run in a handler idem let proceed")

// Record parks the row on the lease until the record commits.
func (l *memLedger) Record(ctx context.Context, user string, p Payment) error {
	lease, ok := storekit.LeaseFromContext(ctx)
	if !ok {
		return errNoLease
	}
	v, err := lease.Attach(pendingKey{}, func() (any, error) { return &pending{}, nil })
	if err != nil {
		return err
	}
	pd := v.(*pending)
	pd.mu.Lock()
	pd.rows = append(pd.rows, ledgerRow{user: user, p: p})
	pd.mu.Unlock()
	return nil
}

// apply books the rows parked on the lease, once the record is committed.
func (l *memLedger) apply(lease storekit.Lease) error {
	v, ok := lease.Detach(pendingKey{})
	if !ok {
		return nil
	}
	pd := v.(*pending)
	pd.mu.Lock()
	rows := pd.rows
	pd.rows = nil
	pd.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, r := range rows {
		if l.byID[r.p.ID] {
			errs = append(errs, fmt.Errorf("ledger: payment %s already booked", r.p.ID))
			continue
		}
		l.byID[r.p.ID] = true
		l.rows = append(l.rows, r)
	}
	return errors.Join(errs...)
}

// List returns user's payments in booking order.
func (l *memLedger) List(_ context.Context, user string) ([]Payment, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Payment
	for _, r := range l.rows {
		if r.user == user {
			out = append(out, r.p)
		}
	}
	return out, nil
}

// ledgerStore is memstore with the ledger's commit hook: Complete books the
// rows parked on the lease once the fenced update succeeded; Fail drops
// them. Embedding keeps memstore's other methods, storekit.Watcher included.
type ledgerStore struct {
	*memstore.Store
	ledger *memLedger
	log    *slog.Logger
}

// Complete implements core.Store.
func (s ledgerStore) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	err := s.Store.Complete(ctx, f, resp)
	lease, ok := storekit.LeaseFromContext(ctx)
	if !ok || lease.Fence() != f {
		return err
	}
	if err != nil {
		lease.Detach(pendingKey{}) // the commit failed: the rows never happened
		return err
	}
	// The response is recorded and will be replayed: the commit stands.
	// Booking can only fail on a payment ID booked twice, which idem's
	// fencing rules out (IDs derive from the key); report it loudly.
	if err := s.ledger.apply(lease); err != nil {
		s.log.ErrorContext(ctx, "ledger: booking after commit failed", "err", err)
	}
	return nil
}

// Fail implements core.Store.
func (s ledgerStore) Fail(ctx context.Context, f storekit.Fence) error {
	if lease, ok := storekit.LeaseFromContext(ctx); ok && lease.Fence() == f {
		lease.Detach(pendingKey{})
	}
	return s.Store.Fail(ctx, f)
}

var _ core.Store = ledgerStore{}
