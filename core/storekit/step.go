package storekit

import "context"

// StepStore is an optional Store capability that keeps the results of a
// handler's steps (see core.Step), as Watcher is for waking waiters. Stores that
// implement it pass the "Steps" cases of core/storetest.
//
// Steps belong to one incarnation of a record: they survive a takeover
// (failed, or processing with a lapsed lease) and are never returned once
// the key is new again after retention. A store may drop them when the
// record completes (no one can take a completed record over).
type StepStore interface {
	// LoadSteps returns the results stored for the steps of the record f
	// owns, by step name (an empty map when there are none), only if f
	// still owns the processing record; otherwise an error wrapping
	// ErrLeaseLost.
	LoadSteps(ctx context.Context, f Fence) (map[string][]byte, error)
	// SaveStep stores result under name for the record f owns, replacing
	// a result of that name, only if f still owns the processing record;
	// otherwise an error wrapping ErrLeaseLost, and nothing changes. The
	// write is durable when SaveStep returns, on its own, outside any
	// transaction the handler's business writes use: it records an effect
	// that happened outside them. The store keeps a copy of result.
	SaveStep(ctx context.Context, f Fence, name string, result []byte) error
}

// ClaimSyncer is implemented by stores whose claims may not be durable when
// Claim returns (pgstore in transactional mode commits them without waiting
// for their WAL flush: a crash loses a lock, never a fact). A relay key
// names its record's incarnation, so once a provider has seen one, the
// record is a fact: were it lost, the retry would create another record and
// relay another key, and the provider would charge twice. core.RelayKey
// therefore asks the store, before the first key of an execution leaves,
// to make the claim durable. SyncClaim returns an error wrapping
// ErrLeaseLost when f no longer owns the record.
type ClaimSyncer interface {
	SyncClaim(ctx context.Context, f Fence) error
}

// MaxStepNameBytes is the longest step name (200 bytes): core.Step refuses
// longer ones (core.ErrStepName), and a store's name column must hold it.
const MaxStepNameBytes = 200
