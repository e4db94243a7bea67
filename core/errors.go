package core

import (
	"errors"

	"github.com/idemkit/idem/core/storekit"
)

// Limits and names fixed by the protocol.
const (
	// MaxKeyBytes is the longest idempotency key accepted, in bytes after
	// decoding.
	MaxKeyBytes = 255
	// MaxStepBytes is the largest result a step may store (64 KiB): a step
	// records what an effect produced (a charge id, a reservation number),
	// not a payload. A larger result fails the step with ErrStepTooLarge.
	MaxStepBytes = 64 << 10
	// ReplayedHeader is the default name of the header marking a replayed
	// response (WithReplayedHeader).
	ReplayedHeader = "Idempotent-Replayed"
)

// Every error core returns of its own, matched with errors.Is.
var (
	// ErrKeyMissing and ErrKeyInvalid: the request's key is absent (and
	// required) or not a valid key.
	ErrKeyMissing = errors.New("idem: idempotency key missing")
	ErrKeyInvalid = errors.New("idem: idempotency key invalid")

	// ErrNoScope refuses (401) a request that names no tenant on an engine
	// without WithScope or WithSharedKeySpace: idem fails closed rather
	// than put every client into one key space.
	ErrNoScope = errors.New("idem: the request has no scope (tenant); set a scope function " +
		"(the adapter's WithScope, or core.WithScope), or opt into one key space shared by all clients with core.WithSharedKeySpace()")

	// Engine.Call's refusals (a *CallError wraps them).
	//
	// ErrInFlight: another call with the key is running (or its owner
	// lost the key to a retry); CallError.RetryAfter says when to retry.
	ErrInFlight = errors.New("idem: a call with this key is in flight")
	// ErrMismatch: the key was used with another name or input.
	ErrMismatch = errors.New("idem: the key was used with another name or input")
	// ErrStoreUnavailable: the store could not be reached, or the result
	// could not be recorded; fn's effect, if it ran, is not known to be
	// recorded, so retry with the same key.
	ErrStoreUnavailable = errors.New("idem: the idempotency store is unavailable")
	// ErrNotRetained: a call with the key completed, but its result was
	// larger than WithMaxResponseBytes and not kept; it will not run again.
	ErrNotRetained = errors.New("idem: the call completed but its result was not kept")

	// Step's, besides the function's own and the store's.
	//
	// ErrStepsUnsupported: the handler runs under a lease granted by a
	// store that does not implement storekit.StepStore. Step refuses to run
	// the function rather than run it unprotected (a takeover would repeat
	// it). WithStepsRequired reports it when the engine is built instead.
	ErrStepsUnsupported = errors.New("idem: the store does not keep steps (it does not implement storekit.StepStore)")
	// ErrStepTooLarge: the function succeeded but its result exceeds
	// MaxStepBytes, so it was not stored. The effect happened and a retry
	// will run it again.
	ErrStepTooLarge = errors.New("idem: step result exceeds MaxStepBytes")
	// ErrStepName: the name is empty, longer than storekit.MaxStepNameBytes,
	// not UTF-8 or holds control characters. The function did not run.
	ErrStepName = errors.New("idem: invalid step name")

	// ErrLeaseLost means the lease of the handler's request no longer owns
	// its record: another owner took the key over (the handler's context is
	// then cancelled with it as the cause), and nothing was changed. It is
	// storekit.ErrLeaseLost.
	ErrLeaseLost = storekit.ErrLeaseLost
	// ErrFinished: Commit or Abort called a second time for one decision.
	ErrFinished = errors.New("idem: decision already committed or aborted")
)
